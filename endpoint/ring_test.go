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
