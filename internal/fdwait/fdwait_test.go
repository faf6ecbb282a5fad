package fdwait

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A pipe stands in for the C library's descriptor: its read end is what
// New watches, and try reads it as the library's non-blocking read would.
func pipe(t *testing.T, nonblocking bool) (r, w int) {
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_CLOEXEC))
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	require.NoError(t, unix.SetNonblock(p[0], nonblocking))
	return p[0], p[1]
}

func TestNewRefusesABlockingDescriptor(t *testing.T) {
	r, _ := pipe(t, false)
	_, err := New(r, "blocking pipe", func() bool { return true })
	require.ErrorIs(t, err, ErrBlocking)
	assert.Contains(t, err.Error(), "blocking pipe")
}

// No descriptor is numbered -1; a closed one could be reused by the time
// New looks at it.
func TestNewRefusesADescriptorThatIsNotOpen(t *testing.T) {
	_, err := New(-1, "no descriptor", func() bool { return true })
	require.ErrorIs(t, err, unix.EBADF)
	assert.Contains(t, err.Error(), "no descriptor")
}

func TestWaitWakesOnDataDeadlineAndClose(t *testing.T) {
	r, w := pipe(t, true)
	got := make([]byte, 1)
	try := func() bool {
		n, err := unix.Read(r, got)
		return n == 1 && err == nil
	}
	wt, err := New(r, "pipe", try)
	require.NoError(t, err)

	go func() {
		time.Sleep(20 * time.Millisecond)
		unix.Write(w, []byte{7})
	}()
	require.NoError(t, wt.Wait(), "woken by the byte")
	assert.Equal(t, byte(7), got[0])

	require.NoError(t, wt.SetDeadline(time.Now().Add(20*time.Millisecond)))
	require.ErrorIs(t, wt.Wait(), os.ErrDeadlineExceeded)
	require.NoError(t, wt.SetDeadline(time.Time{}))

	done := make(chan error, 1)
	go func() { done <- wt.Wait() }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, wt.Close())
	err = <-done
	require.Error(t, err, "woken by Close")
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded)
	_, err = unix.FcntlInt(uintptr(r), unix.F_GETFD, 0)
	require.NoError(t, err, "the original stays open: the C library closes it")
}
