// Package toolrun lets an example's tests run the example's own main as a
// separate process, beside librdmacm's C tools: the test binary runs
// itself with the program's arguments in an environment variable, and
// TestMain hands over to main.
package toolrun

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-rdma/rdmacm/internal/rxetest"
)

const argsEnv = "RDMACM_TOOLRUN_ARGS"

// MainIfAsked runs main with the arguments a Command gave, and exits, when
// this process is one; call it first in TestMain.
func MainIfAsked(main func()) {
	args, ok := os.LookupEnv(argsEnv)
	if !ok {
		return
	}
	os.Args = append([]string{os.Args[0]}, strings.Fields(args)...)
	main()
	os.Exit(0)
}

// Proc is a running program and its combined output.
type Proc struct {
	Name    string
	cmd     *exec.Cmd
	mu      sync.Mutex
	out     strings.Builder
	line    chan string
	done    chan error
	scanned chan struct{} // the output is all read
}

// Go starts this example's main with args.
func Go(t *testing.T, ctx context.Context, args ...string) *Proc {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), argsEnv+"="+strings.Join(args, " "))
	return start(t, "go "+strings.Join(args, " "), cmd)
}

// C starts one of librdmacm's tools, its output line-buffered (stdbuf), so
// that WaitLine sees each line as it is printed.
func C(t *testing.T, ctx context.Context, tool string, args ...string) *Proc {
	return start(t, tool+" "+strings.Join(args, " "),
		exec.CommandContext(ctx, "stdbuf", append([]string{"-oL", tool}, args...)...))
}

func start(t *testing.T, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Name: name, cmd: cmd, line: make(chan string, 64), done: make(chan error, 1), scanned: make(chan struct{})}
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		defer close(p.scanned)
		s := bufio.NewScanner(r)
		for s.Scan() {
			p.mu.Lock()
			p.out.WriteString(s.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.line <- s.Text():
			default:
			}
		}
	}()
	go func() {
		err := cmd.Wait()
		w.Close()
		p.done <- err
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p
}

// WaitLine waits for a line of output containing s; false after d.
func (p *Proc) WaitLine(s string, d time.Duration) bool {
	timeout := time.After(d)
	for {
		select {
		case l := <-p.line:
			if strings.Contains(l, s) {
				return true
			}
		case <-timeout:
			return false
		}
	}
}

// Wait waits for the program to exit and returns its error and output.
func (p *Proc) Wait() (string, error) {
	err := <-p.done
	p.done <- err // for the cleanup
	<-p.scanned
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String(), err
}

// WaitListening waits until the program has a CM id listening, as the
// kernel's table of them (`rdma res show cm_id`) says; false after d. It
// is how a test knows a server is ready for its client when the server
// prints nothing once it listens, as librdmacm's udaddy does not.
func (p *Proc) WaitListening(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		out, err := exec.Command("rdma", "-j", "res", "show", "cm_id").Output()
		var ids []struct {
			State string `json:"state"`
			PID   int    `json:"pid"`
		}
		if err == nil && json.Unmarshal(out, &ids) == nil {
			for _, id := range ids {
				if id.State == "LISTEN" && rxetest.OwnedBy(p.cmd.Process.Pid, id.PID) {
					return true
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// RequireRefused runs this example's main once for each flag and value of
// refusals, a value out of the flag's range, given as -flag value and then
// args (more flags, or the command's operands), and requires a usage error
// each time: exit status 2, with output that names -flag and holds no
// panic.
func RequireRefused(t *testing.T, refusals [][2]string, args ...string) {
	t.Helper()
	for _, r := range refusals {
		flag, value := r[0], r[1]
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		argv := slices.Concat([]string{"-" + flag, value}, args)
		out, err := Go(t, ctx, argv...).Wait()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(out, "-"+flag) || strings.Contains(out, "panic") {
			t.Errorf("%s: want exit status 2 and a message naming -%s; got %v:\n%s", strings.Join(argv, " "), flag, err, out)
		}
	}
}
