package testutil

import (
	"time"

	"github.com/rakelimit/caddy-rakelimit/internal/decide"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/quicclass"
	"github.com/rakelimit/caddy-rakelimit/internal/decide/sketch"
)

// Limits is a configuration that counts every datagram alike (no
// classification), with limit datagrams per second at every level and a
// window of one second.
func Limits(limit uint32) decide.Config {
	return decide.Config{Limiter: sketch.Config{Limit: limit, Window: time.Second}}
}

// QUICLimits is a configuration that classifies datagrams, with the given
// limits per second for connection-opening and established-connection
// packets, and the defaults of the blocked source ports and of the version
// negotiations per second (decide.DefaultVersionNegotiation).
func QUICLimits(opening, established uint32) decide.Config {
	return decide.Config{
		Limiter:      sketch.Config{Limit: opening, Window: time.Second, Established: sketch.Limits{Limit: established}},
		Classify:     true,
		BlockedPorts: quicclass.DefaultBlockedPorts(),
		Negotiation:  decide.DefaultVersionNegotiation,
	}
}
