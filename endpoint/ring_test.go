package endpoint

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRingWrapsAndDrops(t *testing.T) {
	r := ring{buf: make([]uint32, 3)}
	r.push(1)
	r.push(2)
	require.Equal(t, uint32(1), r.pop())
	r.push(3)
	r.push(4) // wraps
	require.Equal(t, 3, r.count)
	r.dropNewest(1)
	require.Equal(t, []uint32{2, 3}, []uint32{r.pop(), r.pop()})
	require.Zero(t, r.count)
}

func TestRingUnpopRestoresTheHead(t *testing.T) {
	r := ring{buf: make([]uint32, 4)}
	for v := range uint32(4) {
		r.push(v)
	}
	require.Equal(t, []uint32{0, 1, 2}, []uint32{r.pop(), r.pop(), r.pop()})
	r.push(4) // wraps
	r.unpop([]uint32{0, 2})
	require.Equal(t, 4, r.count)
	require.Equal(t, []uint32{0, 2, 3, 4}, []uint32{r.pop(), r.pop(), r.pop(), r.pop()})
	r.push(5)
	r.unpop(nil)
	require.Equal(t, uint32(5), r.pop())
}

func TestSlotTableReuse(t *testing.T) {
	st := newSlotTable(2)
	a := st.take(&Request{Context: "a"}, 0)
	b := st.take(&Request{Context: "b"}, 0)
	require.NotEqual(t, a, b)
	require.Equal(t, 2, st.inUse())
	require.Equal(t, "a", st.release(a).ctx)
	require.Equal(t, 1, st.inUse())
	c := st.take(&Request{Context: "c"}, 0)
	require.Equal(t, a, c, "a freed slot is reused")
}
