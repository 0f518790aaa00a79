package userspace

import (
	"net/netip"
	"time"

	"github.com/rakelimit/caddy-rakelimit/bpf"
	"github.com/rakelimit/caddy-rakelimit/internal/datagram"
)

// learner is what the write-path learner calls on an engine: the kernel
// filter and the userspace limiter both have it.
type learner interface {
	LearnServerID(id datagram.ServerID) error
	LearnPeer(addr netip.Addr) error
	ExpireLearned(lifetime time.Duration) (ids, peers int, err error)
}

var (
	_ learner = (*bpf.Filter)(nil)
	_ learner = (*Limiter)(nil)
)
