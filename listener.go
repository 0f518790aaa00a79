//go:build linux

package rakelimit

import (
	"fmt"
	"net"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// state is what a provisioned wrapper holds.
type state struct {
	logger *zap.Logger
	lim    *limiter
}

// Provision loads the filter (or joins the one already loaded under the
// same name) so that every error, from bad settings to a missing CAP_BPF,
// fails the configuration before any socket is touched.
func (r *RakeLimit) Provision(ctx caddy.Context) error {
	r.logger = ctx.Logger()
	set, err := r.settings()
	if err != nil {
		return err
	}
	r.set = set
	app, err := loadApp(ctx)
	if err != nil {
		return err
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	lim, err := limiters.acquire(r.name(), set, r.logger)
	if err != nil {
		return err
	}
	r.lim = lim // from here on, Cleanup releases it
	// Each configuration load has its own metrics registry: it tells two
	// wrappers of one load from a reload.
	return lim.provision(app, ctx.GetMetricsRegistry(), set, r.logger)
}

// Cleanup releases the limiter; the last wrapper of a name to go detaches
// its filter from the sockets that remain and closes it.
func (r *RakeLimit) Cleanup() error {
	if r.lim == nil {
		return nil
	}
	r.lim = nil
	return limiters.release(r.name())
}

// WrapPacketConn attaches the filter to the socket under pc and returns the
// socket itself, a *net.UDPConn, so that quic-go keeps its fast path
// (batched reads, GSO, ECN, path MTU discovery). Caddy calls it when it opens
// a listener; it cannot fail the configuration, so a socket it cannot
// protect is logged as an error and served unprotected.
func (r *RakeLimit) WrapPacketConn(pc net.PacketConn) net.PacketConn {
	conn := udpConn(pc)
	if conn == nil {
		r.lim.attachErrors.Add(1)
		r.logger.Error("listener NOT protected: no UDP socket under the packet conn",
			zap.String("limiter", r.name()), zap.String("type", fmt.Sprintf("%T", pc)))
		return pc
	}
	attached, err := r.lim.attach(conn)
	if err != nil {
		r.lim.attachErrors.Add(1)
		r.logger.Error("listener NOT protected", zap.String("limiter", r.name()),
			zap.String("listener", conn.LocalAddr().String()), zap.Error(err))
		return conn
	}
	if attached {
		r.logger.Info("protecting listener", zap.String("limiter", r.name()),
			zap.String("listener", conn.LocalAddr().String()),
			zap.Uint32("limit", r.set.Limiter.Limit), zap.Duration("window", r.set.Limiter.Window),
			zap.Bool("dry_run", r.set.DryRun), zap.Int("allowlisted_prefixes", len(r.set.Allow)))
	}
	return conn
}

// udpConn finds the *net.UDPConn under Caddy's wrappers.
func udpConn(pc net.PacketConn) *net.UDPConn {
	for pc != nil {
		if c, ok := pc.(*net.UDPConn); ok {
			return c
		}
		u, ok := pc.(interface{ Unwrap() net.PacketConn })
		if !ok {
			return nil
		}
		pc = u.Unwrap()
	}
	return nil
}
