package testbed

import (
	"fmt"
	"io"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks as an
// initramfs. Only what an initramfs needs: directories, regular files,
// character devices, symlinks.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	n   int64
	err error
}

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeChr  = 0o020000
	modeLink = 0o120000
)

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	var n int
	n, c.err = c.w.Write(p)
	c.n += int64(n)
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rdevMajor, rdevMinor uint32) {
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name))
	c.write([]byte{0})
	c.pad()
	c.write(data)
	c.pad()
}

// Dir adds a directory.
func (c *cpioWriter) Dir(name string) { c.entry(name, modeDir|0o755, nil, 0, 0) }

// File adds a regular file with the given permission bits.
func (c *cpioWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, modeFile|perm, data, 0, 0)
}

// Symlink adds a symbolic link to target.
func (c *cpioWriter) Symlink(name, target string) {
	c.entry(name, modeLink|0o777, []byte(target), 0, 0)
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, major, minor uint32) {
	c.entry(name, modeChr|0o600, nil, major, minor)
}

// Close writes the trailer and reports the first error seen.
func (c *cpioWriter) Close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	return c.err
}
