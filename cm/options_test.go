package cm

import (
	"context"
	"errors"
	"testing"

	"github.com/go-rdma/rdmacm/endpoint"
)

// A read depth the CM cannot carry is refused before anything is created,
// so no device is needed.
func TestReadDepthOutOfRangeIsRefused(t *testing.T) {
	for _, n := range []int{0, -1, 256} {
		_, err := Dial(context.Background(), "127.0.0.1:1", WithReadDepth(n))
		if !errors.Is(err, endpoint.ErrInvalid) {
			t.Errorf("Dial with WithReadDepth(%d): %v, want ErrInvalid", n, err)
		}
		_, err = Listen(context.Background(), "127.0.0.1:0", WithReadDepth(n))
		if !errors.Is(err, endpoint.ErrInvalid) {
			t.Errorf("Listen with WithReadDepth(%d): %v, want ErrInvalid", n, err)
		}
	}
}
