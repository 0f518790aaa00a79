//go:build linux

package filterbench

import (
	"bytes"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Names in Cloudflare's object: its socket filters by family, its map of
// drops by level, and the constant its loader rewrites to the limit in
// packets per second (rakelimit.go, rewriteConstant).
const (
	cloudflareIPv4  = "filter_ipv4"
	cloudflareIPv6  = "filter_ipv6"
	cloudflareStats = "stats"
	cloudflareLimit = "LIMIT"
)

// cloudflareProgram is one loaded instance of Cloudflare's filter, with its
// own count-min sketches.
type cloudflareProgram struct {
	coll  *ebpf.Collection
	prog  *ebpf.Program
	stats *ebpf.Map
}

// parseCloudflare reads Cloudflare's object.
func parseCloudflare(obj []byte) (*ebpf.CollectionSpec, error) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("reading Cloudflare's object: %w", err)
	}
	for _, name := range []string{cloudflareIPv4, cloudflareIPv6} {
		if spec.Programs[name] == nil {
			return nil, fmt.Errorf("cloudflare's object has no program %s", name)
		}
	}
	if spec.Maps[cloudflareStats] == nil {
		return nil, fmt.Errorf("cloudflare's object has no map %s", cloudflareStats)
	}
	return spec, nil
}

// loadCloudflare loads the IPv4 or IPv6 filter of spec with limit packets
// per second, as Cloudflare's loader does: the limit is the constant of
// every instruction that references LIMIT.
func loadCloudflare(spec *ebpf.CollectionSpec, ipv6 bool, limit uint32) (*cloudflareProgram, error) {
	name := cloudflareIPv4
	if ipv6 {
		name = cloudflareIPv6
	}
	s := spec.Copy()
	ps := s.Programs[name]
	s.Programs = map[string]*ebpf.ProgramSpec{name: ps}
	rewritten := 0
	for i := range ps.Instructions {
		ins := &ps.Instructions[i]
		if ins.Reference() != cloudflareLimit {
			continue
		}
		if !ins.IsConstantLoad(asm.DWord) {
			return nil, fmt.Errorf("cloudflare's %s: instruction %d references %s but is no 64-bit constant load: %v", name, i, cloudflareLimit, ins)
		}
		ins.Constant = int64(limit)
		*ins = ins.WithReference("")
		rewritten++
	}
	if rewritten == 0 {
		return nil, fmt.Errorf("cloudflare's %s never references %s", name, cloudflareLimit)
	}
	coll, err := ebpf.NewCollection(s)
	if err != nil {
		return nil, fmt.Errorf("loading Cloudflare's %s: %w", name, err)
	}
	return &cloudflareProgram{coll: coll, prog: coll.Programs[name], stats: coll.Maps[cloudflareStats]}, nil
}

// drops returns the packets Cloudflare's filter dropped, at every level.
func (c *cloudflareProgram) drops() (uint64, error) {
	var total uint64
	it := c.stats.Iterate()
	var k uint32
	var v uint64
	for it.Next(&k, &v) {
		total += v
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("reading Cloudflare's drops: %w", err)
	}
	return total, nil
}

// Close releases the program and its maps.
func (c *cloudflareProgram) Close() error {
	c.coll.Close()
	return nil
}
