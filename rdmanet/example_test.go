package rdmanet_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/go-rdma/rdmacm/rdmanet"
)

// net/http over RDMA: the server serves on an rdmanet Listener, and the
// client's Transport dials with an rdmanet Dialer. The handler and the
// requests are plain net/http. (gRPC takes the same two hooks:
// grpc.Server.Serve(l), and grpc.WithContextDialer with a function that
// calls rdmanet.Dial; examples/grpc does it.)
func Example_http() {
	ctx := context.Background()
	l, err := rdmanet.Listen(ctx, net.JoinHostPort(os.Getenv("RDMACM_TEST_ADDR"), "0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over %s", r.URL.Path[1:])
	})}
	go srv.Serve(l)
	defer srv.Shutdown(ctx)

	tr := &http.Transport{DialContext: (&rdmanet.Dialer{}).DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	resp, err := client.Get("http://" + l.Addr().String() + "/rdma")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.Status, string(body))
	// Output: 200 OK hello over rdma
}
