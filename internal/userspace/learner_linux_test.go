package userspace

import (
	"net/netip"
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/kernel"
)

// learner is what the write-path learner calls on an engine: the kernel
// filter and the userspace limiter both have it.
type learner interface {
	LearnServerID(id decide.ServerID, to netip.Addr) error
	LearnPeer(addr netip.Addr) error
	Grant(addr netip.Addr, credits int) error
	ExpireLearned(lifetime time.Duration) ([decide.NumLearned]int, error)
	Learned() decide.Learned
	AdoptLearned(from decide.Learned)
}

var (
	_ learner = (*kernel.Program)(nil)
	_ learner = (*Decider)(nil)
)
