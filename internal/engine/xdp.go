package engine

import (
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// SocketFilterOnlyError is Protect's error in mode xdp when the XDP program
// runs on none of the listener's interfaces: the socket filter alone
// protects it. A chain (mode auto) falls back to the next mode; mode xdp
// keeps the listener, protected by the socket filter (it fails closed).
type SocketFilterOnlyError struct {
	Listener string
	// Refused are the kernel's refusals, one per interface.
	Refused []string
}

func (e *SocketFilterOnlyError) Error() string {
	return fmt.Sprintf("the XDP program runs on none of %s's interfaces (%s); the socket filter alone protects it",
		e.Listener, strings.Join(e.Refused, "; "))
}

// xdpReporter is an engine that runs the XDP program: its interfaces, and
// the last failure to keep its table of destinations.
type xdpReporter interface {
	XDPInterfaces() []report.XDPInterface
	XDPTableError() error
}

// socketFilterOnly reports whether err says the socket filter alone
// protects the listener (SocketFilterOnlyError).
func socketFilterOnly(err error) bool {
	var only *SocketFilterOnlyError
	return errors.As(err, &only)
}

// warnXDP logs, once each, the interfaces of the listeners' traffic where
// the engine's XDP program does not run: those it left out by default in
// one INFO line that says how to name them, each the kernel refused in a
// WARN line with the reason; and a new failure to keep its table. The
// socket filter decides their traffic. l.warnMu guards what was logged.
func (l *Limiter) warnXDP(eng Engine, logger *zap.Logger) {
	x, ok := eng.(xdpReporter)
	if !ok {
		return
	}
	l.warnMu.Lock()
	defer l.warnMu.Unlock()
	if l.xdpWarned == nil {
		l.xdpWarned = map[string]bool{}
	}
	var leftOut []string
	for _, i := range x.XDPInterfaces() {
		key := i.Name + "\x00" + i.Reason
		if i.Attach != report.XDPSocketFilterOnly || l.xdpWarned[key] {
			continue
		}
		l.xdpWarned[key] = true
		if i.LeftOut {
			leftOut = append(leftOut, fmt.Sprintf("%s (%s)", i.Name, i.Reason))
			continue
		}
		logger.Warn("the XDP program does not run on this interface; the socket filter decides the listeners' traffic there",
			zap.String("limiter", l.name), zap.String("interface", i.Name), zap.Strings("listeners", i.Listeners),
			zap.String("reason", i.Reason))
	}
	if len(leftOut) > 0 {
		logger.Info("the XDP program is not put on these interfaces by default, and the socket filter decides the listeners' "+
			"traffic there: name them in xdp_interfaces to try it (with xdp_generic where the driver has no native XDP)",
			zap.String("limiter", l.name), zap.Strings("interfaces", leftOut))
	}
	if err := x.XDPTableError(); err != nil && err.Error() != l.xdpTableWarned {
		l.xdpTableWarned = err.Error()
		logger.Warn("the XDP program's table of destinations is not current; it decides for those it has, the socket filter "+
			"for the rest", zap.String("limiter", l.name), zap.Error(err))
	}
}
