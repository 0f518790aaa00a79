package engine

import (
	"go.uber.org/zap"

	"github.com/rakelimit/caddy-rakelimit/internal/packetconn/learn"
)

// The server's connection IDs and peers: each protected socket's conn
// shows what quic-go writes to the limiter's learner (package learn), which
// teaches the engine in force; the engine verifies what clients send
// against it, and forgets what was not used for IDLifetime.

// IDLifetime is how long an engine keeps a server connection ID or a peer
// that is not used: a bit more than quic-go's idle timeout (30 s), after
// which the connection is gone.
const IDLifetime = learn.DefaultLifetime

// expireLearnedEvery is how many ticks of the expiry loop (seconds) pass
// between two expiries of the learned IDs and peers.
const expireLearnedEvery = 5

// Learned returns what the limiter's learner has seen and taught.
func (l *Limiter) Learned() learn.Counts { return l.learner.Counts() }

// VerificationOff reports whether the server's connection IDs cannot be
// verified (it sent IDs of another length than quic-go's default).
func (l *Limiter) VerificationOff() bool { return l.oddIDs.Load() }

// oddID turns verification off when the server sends connection IDs of a
// length the filter cannot verify, and says so once.
func (l *Limiter) oddID(length int) {
	if l.oddIDs.Swap(true) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.eng.Configure(l.effective(l.put.Config)); err != nil {
		l.put.Logger.Error("turning connection ID verification off", zap.String("limiter", l.name), zap.Error(err))
	}
	l.put.Logger.Error("the server sends connection IDs of another length than quic-go's default 4 bytes: "+
		"rakelimit cannot verify them and turns connection ID verification off: client packets are classified by their headers alone",
		zap.String("limiter", l.name), zap.Int("length", length))
}
