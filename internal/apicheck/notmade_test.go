package apicheck

import (
	"go/types"
	"reflect"
	"testing"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
	"github.com/go-rdma/rdmacm/internal/callall"
	"github.com/go-rdma/rdmacm/msg"
	"github.com/go-rdma/rdmacm/rdmanet"
)

// notMade is a nil and a zero pointer of every exported struct type with
// methods on its pointer: values no constructor made. Error types are
// there as zero values only (a nil error pointer's Error panics, as the
// standard library's do).
var notMade = []any{
	(*bufpool.PD)(nil), &bufpool.PD{},
	(*bufpool.Pool)(nil), &bufpool.Pool{},
	(*bufpool.Region)(nil), &bufpool.Region{},
	(*bufpool.Buffer)(nil), &bufpool.Buffer{},
	(*bufpool.Segment)(nil), &bufpool.Segment{},
	(*bufpool.Remote)(nil), &bufpool.Remote{},
	(*bufpool.Stats)(nil), &bufpool.Stats{},
	&cm.RejectError{},
	(*cm.Listener)(nil), &cm.Listener{},
	(*cm.Request)(nil), &cm.Request{},
	(*dgram.Addr)(nil), &dgram.Addr{},
	(*dgram.Conn)(nil), &dgram.Conn{},
	(*dgram.Message)(nil), &dgram.Message{},
	(*dgram.Stats)(nil), &dgram.Stats{},
	(*endpoint.Completion)(nil), &endpoint.Completion{},
	(*endpoint.Endpoint)(nil), &endpoint.Endpoint{},
	&endpoint.CompletionError{}, &endpoint.PostError{},
	(*endpoint.Request)(nil), &endpoint.Request{},
	(*endpoint.SRQ)(nil), &endpoint.SRQ{},
	(*endpoint.Stats)(nil), &endpoint.Stats{},
	(*msg.Message)(nil), &msg.Message{},
	(*msg.Conn)(nil), &msg.Conn{},
	(*msg.Listener)(nil), &msg.Listener{},
	(*msg.Header)(nil), &msg.Header{},
	(*msg.Client)(nil), &msg.Client{},
	(*msg.Server)(nil), &msg.Server{},
	(*msg.Stats)(nil), &msg.Stats{},
	(*msg.ClientStats)(nil), &msg.ClientStats{},
	(*msg.ServerStats)(nil), &msg.ServerStats{},
	&msg.RemoteError{},
	(*msg.Mux)(nil), &msg.Mux{},
	(*rdmanet.Conn)(nil), &rdmanet.Conn{},
	(*rdmanet.Listener)(nil), &rdmanet.Listener{},
	(*rdmanet.Dialer)(nil), &rdmanet.Dialer{},
}

// shortBufferPanics are the methods that panic by contract on a buffer
// too short for what they write, as encoding/binary's Put functions do.
var shortBufferPanics = map[string]bool{"msg.Header.Encode": true}

// TestNotMadeValuesNeitherPanicNorHang calls every exported method of
// every value in notMade, with zero arguments (and a live context), and
// fails on a panic or a call still running after a while (callall): a
// value never made must fail with an error or give zero values, as net's
// conns do. It fails too when a public package has a struct type with pointer
// methods that notMade lacks, so that a new type is checked as well.
func TestNotMadeValuesNeitherPanicNorHang(t *testing.T) {
	listed := map[string]bool{}
	for _, v := range notMade {
		e := reflect.TypeOf(v).Elem()
		listed[e.PkgPath()+"."+e.Name()] = true
	}
	for path, pkg := range importPublic(t) {
		scope := pkg.Scope()
		for _, name := range scope.Names() {
			tn, ok := scope.Lookup(name).(*types.TypeName)
			if !ok || !tn.Exported() {
				continue
			}
			if _, ok := tn.Type().Underlying().(*types.Struct); !ok {
				continue
			}
			if types.NewMethodSet(types.NewPointer(tn.Type())).Len() > 0 && !listed[path+"."+name] {
				t.Errorf("%s.%s has methods but is not in notMade", path, name)
			}
		}
	}
	for _, v := range notMade {
		skip := func(method string) bool {
			return shortBufferPanics[reflect.TypeOf(v).Elem().String()+"."+method]
		}
		for _, problem := range callall.Every(v, skip) {
			t.Error(problem)
		}
	}
}
