package main

import (
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestModulesRegistered: the development binary carries the wrapper and its
// app, so `caddy list-modules` shows caddy.packetconns.rakelimit.
func TestModulesRegistered(t *testing.T) {
	for _, id := range []string{"caddy.packetconns.rakelimit", "rakelimit"} {
		if _, err := caddy.GetModule(id); err != nil {
			t.Errorf("module %s not registered: %v", id, err)
		}
	}
}
