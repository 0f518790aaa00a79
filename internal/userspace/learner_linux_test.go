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
	LearnServerID(id decide.ServerID) error
	LearnPeer(addr netip.Addr) error
	ExpireLearned(lifetime time.Duration) (ids, peers int, err error)
}

var (
	_ learner = (*kernel.Filter)(nil)
	_ learner = (*Limiter)(nil)
)
