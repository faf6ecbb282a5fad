package apicheck

import (
	"context"
	"fmt"
	"go/types"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdmacm/bufpool"
	"github.com/go-rdma/rdmacm/cm"
	"github.com/go-rdma/rdmacm/dgram"
	"github.com/go-rdma/rdmacm/endpoint"
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
// fails on a panic or a call still running after a while: a value never
// made must fail with an error or give zero values, as net's conns do.
// Methods on a value receiver are called on the zero value only: Go
// itself panics calling one through a nil pointer.
// It fails too when a public package has a struct type with pointer
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
	ctxType := reflect.TypeFor[context.Context]()
	for _, v := range notMade {
		rv := reflect.ValueOf(v)
		which := "zero"
		if rv.IsNil() {
			which = "nil"
		}
		elem := rv.Type().Elem()
		for i := range rv.NumMethod() {
			m := rv.Type().Method(i)
			_, valueMethod := elem.MethodByName(m.Name)
			if valueMethod && which == "nil" || shortBufferPanics[elem.String()+"."+m.Name] {
				continue
			}
			args := make([]reflect.Value, m.Type.NumIn()-1)
			for j := range args {
				if at := m.Type.In(j + 1); at == ctxType {
					args[j] = reflect.ValueOf(context.Background())
				} else {
					args[j] = reflect.Zero(at)
				}
			}
			call := fmt.Sprintf("%s %T.%s", which, v, m.Name)
			if msg := callBriefly(rv.Method(i), args, m.Type.IsVariadic()); msg != "" {
				t.Errorf("%s: %s", call, msg)
			}
		}
	}
}

// callBriefly calls f with args and says how it went wrong: a panic, or
// no return within two seconds ("" if it returned).
func callBriefly(f reflect.Value, args []reflect.Value, variadic bool) string {
	done := make(chan string, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Sprintf("panicked: %v", r)
			}
		}()
		if variadic {
			f.CallSlice(args)
		} else {
			f.Call(args)
		}
		done <- ""
	}()
	select {
	case msg := <-done:
		return strings.TrimSpace(msg)
	case <-time.After(2 * time.Second):
		return "still running after 2s"
	}
}
