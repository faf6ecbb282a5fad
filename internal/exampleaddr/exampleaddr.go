// Package exampleaddr gives the example programs their address when -addr
// is not given: the testbed's device address (RDMACM_TEST_ADDR, which
// bin/rxevm sets) with the example's own port.
package exampleaddr

import (
	"errors"
	"net"
	"os"
)

// Or returns addr if it is set, else the testbed's address with port.
func Or(addr, port string) (string, error) {
	if addr != "" {
		return addr, nil
	}
	host := os.Getenv("RDMACM_TEST_ADDR")
	if host == "" {
		return "", errors.New("give -addr, or run under bin/rxevm (which sets RDMACM_TEST_ADDR)")
	}
	return net.JoinHostPort(host, port), nil
}
