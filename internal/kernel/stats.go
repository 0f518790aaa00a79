//go:build linux

package kernel

import (
	"fmt"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
)

// Stats reads the datagram counters, summed over CPUs.
func (f *Program) Stats() (decide.Stats, error) {
	var per []rakelimitStats
	if err := f.objs.Counters.Lookup(uint32(0), &per); err != nil {
		return decide.Stats{}, fmt.Errorf("reading the filter counters: %w", err)
	}
	var s decide.Stats
	for i := range per {
		// The layouts are the same: the size check in program.go, and the
		// differential tests compare every counter.
		s.Add((*decide.Stats)(unsafe.Pointer(&per[i])))
	}
	return s, nil
}

// Info describes the loaded program's size.
type Info struct {
	// Instructions is the number of BPF instructions after verification.
	Instructions int
	// MapBytes is the memory of the maps' keys and values: sketches,
	// configuration, per-CPU counters, tracked streams, learned server IDs
	// and peers, and the event ring buffer (the allowlist, allocated per
	// entry, is left out; so is the kernel's bookkeeping per entry of the
	// hash maps, which for the learned sets is several times their keys
	// and values).
	MapBytes int
	// SketchBytes is the memory of the sketches alone.
	SketchBytes int
}

// Info reports the program's instruction count and map memory.
func (f *Program) Info() (Info, error) {
	pi, err := f.objs.Rakelimit.Info()
	if err != nil {
		return Info{}, fmt.Errorf("reading program info: %w", err)
	}
	insns, err := pi.Instructions()
	if err != nil {
		return Info{}, fmt.Errorf("reading program instructions: %w", err)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return Info{}, err
	}
	var in Info
	in.Instructions = len(insns)
	for _, m := range []*ebpf.Map{f.objs.Cells, f.objs.Configs, f.objs.ActiveConfig, f.objs.TestVerdict, f.objs.Streams,
		f.objs.FairShares, f.objs.Pacer, f.objs.ServerIds, f.objs.ProvenPeers, f.objs.AnsweredPeers, f.objs.Quick} {
		in.MapBytes += int(m.MaxEntries() * (m.KeySize() + m.ValueSize()))
	}
	in.SketchBytes = int(f.objs.Cells.MaxEntries() * f.objs.Cells.ValueSize())
	in.MapBytes += int(f.objs.Events.MaxEntries()) // ring buffer bytes
	for _, m := range []*ebpf.Map{f.objs.Counters, f.objs.CpuState} {
		in.MapBytes += cpus * int(m.ValueSize())
	}
	return in, nil
}
