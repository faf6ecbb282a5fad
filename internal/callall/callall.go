// Package callall calls every exported method of a value, for the tests
// that check no method of a value in some state (never made, closed)
// panics or waits for ever.
package callall

import (
	"context"
	"fmt"
	"reflect"
	"time"
)

// Bound is how long a call may run before it counts as waiting for ever.
const Bound = 2 * time.Second

// Every calls each exported method of v (a pointer) that skip does not
// name, with zero arguments (a context.Context argument gets
// context.Background, a variadic one nothing), and returns one line for
// each that panicked or ran past Bound. Methods with a value receiver are
// skipped on a nil pointer: Go itself panics calling one through it. A
// call still running is left to run.
func Every(v any, skip func(method string) bool) []string {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer {
		return []string{fmt.Sprintf("%T is not a pointer", v)}
	}
	which := "a"
	if rv.IsNil() {
		which = "a nil"
	}
	var problems []string
	for i := range rv.NumMethod() {
		m := rv.Type().Method(i)
		if _, valueMethod := rv.Type().Elem().MethodByName(m.Name); valueMethod && rv.IsNil() || skip != nil && skip(m.Name) {
			continue
		}
		args := make([]reflect.Value, m.Type.NumIn()-1)
		for j := range args {
			if at := m.Type.In(j + 1); at == contextType {
				args[j] = reflect.ValueOf(context.Background())
			} else {
				args[j] = reflect.Zero(at)
			}
		}
		if msg := call(rv.Method(i), args, m.Type.IsVariadic()); msg != "" {
			problems = append(problems, fmt.Sprintf("%s %T's %s %s", which, v, m.Name, msg))
		}
	}
	return problems
}

var contextType = reflect.TypeFor[context.Context]()

// call calls f with args and says how it went wrong: a panic, or no
// return within Bound ("" if it returned).
func call(f reflect.Value, args []reflect.Value, variadic bool) string {
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
		return msg
	case <-time.After(Bound):
		return fmt.Sprintf("was still running after %v", Bound)
	}
}
