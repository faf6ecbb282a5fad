// Package flagcheck checks the numeric flags of the project's commands once
// they are parsed, so that a count, size or depth out of range is a usage
// error naming the flag instead of a failure, or a panic, deep in a run.
package flagcheck

import (
	"flag"
	"fmt"
)

// AtLeast returns an error naming the first of the named int flags of fs
// whose value is below least, or nil when none is. A name that is not an
// int flag of fs is an error too: the command's own mistake, which its
// test finds.
func AtLeast(fs *flag.FlagSet, least int, names ...string) error {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			return fmt.Errorf("no flag -%s to check", name)
		}
		v, ok := intValue(f.Value)
		switch {
		case !ok:
			return fmt.Errorf("-%s is not an int flag", name)
		case v < least:
			return fmt.Errorf("-%s %d: want at least %d", name, v, least)
		}
	}
	return nil
}

// intValue is an int flag's value; false for a flag of another kind.
func intValue(v flag.Value) (int, bool) {
	g, ok := v.(flag.Getter)
	if !ok {
		return 0, false
	}
	n, ok := g.Get().(int)
	return n, ok
}
