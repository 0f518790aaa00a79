//go:build linux

package kernel

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Sweep resets the sketch cells idle for so long that their 32-bit epoch
// could wrap (see sketch.Limiter.Sweep); the filter's owner runs it at least
// daily. It returns how many cells it reset.
func (f *Program) Sweep() (int, error) {
	return f.sweep(uint32(newMonoClock().now >> sketch.EpochShift))
}

func (f *Program) sweep(epoch uint32) (int, error) {
	lines := int(f.objs.Cells.MaxEntries())
	page := unix.Getpagesize()
	size := (lines*sketch.LineBytes + page - 1) / page * page
	// The cells map is BPF_F_MMAPABLE: mapped here, its cells are reset
	// one at a time with atomic operations, never through a copy of a
	// line that packets may have counted in since it was read.
	mem, err := unix.Mmap(f.objs.Cells.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("mapping the sketches: %w", err)
	}
	defer unix.Munmap(mem)
	var stale []int
	for off := 0; off < lines*sketch.LineBytes; off += sketch.LineBytes {
		for c := off; c < off+sketch.CellsPerLine*sketch.CellBytes; c += sketch.CellBytes {
			if sketch.Stale(atomic.LoadUint32(word(mem, c)), epoch) {
				stale = append(stale, c)
			}
		}
	}
	if f.sweepHook != nil {
		f.sweepHook()
	}
	swept := 0
	for _, c := range stale {
		if resetCell(mem, c, epoch) {
			swept++
		}
	}
	if err := f.sweepPending(epoch); err != nil {
		return swept, err
	}
	return swept, nil
}

// sweepPending moves the CPUs' stale pending counts of the socket's total
// (count_total; those of a class without packets on a CPU for the horizon)
// to epoch, as sketch.Limiter.Sweep does, so that no pending epoch idles
// long enough to wrap. They are not counted as swept. A per-CPU map is
// written whole: a CPU that counted in its pending cell between the read
// and the write loses those packets' counts (at most the packets of that
// moment, once a day, and only when some CPU has a stale one).
func (f *Program) sweepPending(epoch uint32) error {
	var all []rakelimitPending
	if err := f.objs.Totals.Lookup(uint32(0), &all); err != nil {
		return fmt.Errorf("reading the pending totals: %w", err)
	}
	changed := false
	for i := range all {
		for c := range all[i].Cell {
			cl := &all[i].Cell[c]
			if sketch.Stale(cl.Epoch, epoch) {
				cl.Epoch = epoch
				for b := range cl.Budget {
					cl.Budget[b].Offered, cl.Budget[b].Forwarded = 0, 0
				}
				changed = true
			}
		}
	}
	if !changed {
		return nil
	}
	if err := f.objs.Totals.Update(uint32(0), all, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("sweeping the pending totals: %w", err)
	}
	return nil
}

// word is the 32-bit word at offset off of the mapped sketches. The map's
// memory is not Go's: the pointer is to the mapping, which outlives its use.
func word(mem []byte, off int) *uint32 {
	return (*uint32)(unsafe.Pointer(&mem[off]))
}

// resetCell resets the cell at offset c of the mapped sketches to epoch if
// it is still stale, and reports whether it did. A packet that touches a
// stale cell first moves its epoch (rescale's compare-and-swap), so each
// counter is cleared only if it still holds the value read with the stale
// epoch, and the epoch is moved last, only if no packet moved it: a packet
// counted in the cell meanwhile keeps its count, and the cell is then the
// packet's (and not counted as swept).
func resetCell(mem []byte, c int, epoch uint32) bool {
	e := atomic.LoadUint32(word(mem, c))
	if !sketch.Stale(e, epoch) {
		return false
	}
	// The counters follow the epoch: two budgets of offered and forwarded.
	for off := c + 4; off < c+sketch.CellBytes; off += 4 {
		if v := atomic.LoadUint32(word(mem, off)); v != 0 {
			atomic.CompareAndSwapUint32(word(mem, off), v, 0)
		}
	}
	return atomic.CompareAndSwapUint32(word(mem, c), e, epoch)
}
