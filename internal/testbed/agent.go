package testbed

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// job is what the host asks a guest to run. It travels as JSON on the
// writable share, because a kernel command line is too short and too hard to
// quote for an arbitrary environment.
type job struct {
	Argv        []string
	Env         []string
	Dir         string
	StartedFile string // written before the command runs: the guest booted
	StatusFile  string
}

// GuestAgent runs inside the guest (chrooted into the host's root): it runs
// the job's command with stdout on ttyS1 and stderr on ttyS2, writes the exit
// status to the share, and returns. The guest's init powers off afterwards.
func GuestAgent(jobFile string) error {
	data, err := os.ReadFile(jobFile)
	if err != nil {
		return err
	}
	var j job
	if err := json.Unmarshal(data, &j); err != nil {
		return fmt.Errorf("job %s: %w", jobFile, err)
	}
	if err := os.WriteFile(j.StartedFile, nil, 0o644); err != nil {
		return err
	}
	stdout, err := os.OpenFile("/dev/ttyS1", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	stderr, err := os.OpenFile("/dev/ttyS2", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	// Root in the guest may lock any amount of memory, but siw (unlike rxe
	// and hardware drivers) checks RLIMIT_MEMLOCK even for root: lift it,
	// as the README asks of every user.
	unlimited := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unlimited); err != nil {
		fmt.Fprintf(stderr, "rxevm: cannot lift the locked-memory limit: %v\n", err)
	}
	cmd := exec.Command(j.Argv[0], j.Argv[1:]...)
	cmd.Env = j.Env
	cmd.Dir = j.Dir
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	status := 0
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		switch {
		case errors.As(err, &exitErr):
			status = exitErr.ExitCode()
			if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				status = 128 + int(ws.Signal())
			}
		default:
			fmt.Fprintf(stderr, "rxevm: cannot run %q in the guest: %v\n", j.Argv[0], err)
			status = 127
		}
	}
	// A write to a tty returns once the bytes are buffered, not sent; wait
	// until the UART has sent them all, or the tail is lost at power-off.
	for _, f := range []*os.File{stdout, stderr} {
		unix.IoctlSetInt(int(f.Fd()), unix.TCSBRK, 1) // tcdrain
	}
	return os.WriteFile(j.StatusFile, []byte(strconv.Itoa(status)), 0o644)
}
