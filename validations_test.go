package rakelimit

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestValidatedOncePerBoundary counts the validations of one wrapper's
// limiter configuration (sketch.Config.OnValidate, which the wrapper's
// onValidate sets) on its way from the operator to the engine: one where
// the Caddyfile's tokens become options, one where the JSON's options
// become the decision configuration (Provision; Caddy's Validate after it
// checks nothing again), and one where the engine takes it (its start, or
// the commit of a changed configuration). A configuration already checked
// is not checked again inside a boundary, and one the engine runs already
// is not put in force again.
func TestValidatedOncePerBoundary(t *testing.T) {
	name := fmt.Sprintf("validations-%p", t)
	// Each load is one wrapper of one configuration, loaded as Caddy
	// loads it; the second changes the limit of the running limiter.
	loads := []struct {
		name      string
		caddyfile string
		// The validations of each step: the adaption of the Caddyfile,
		// Provision (the options, and the engine's start for a new
		// limiter), Validate, and the app's Start (the commit).
		adapt, provision, validate, commit int
	}{
		{"first load starts the limiter", "rakelimit {\n limit 2000\n mode userspace\n name " + name + "\n}", 1, 2, 0, 0},
		{"reload changes the limit", "rakelimit {\n limit 3000\n mode userspace\n name " + name + "\n}", 1, 1, 0, 1},
		{"reload keeps the settings", "rakelimit {\n limit 3000\n mode userspace\n name " + name + "\n}", 1, 1, 0, 0},
	}
	// Every load's wrapper holds the limiter until the test ends, as a
	// running configuration does until the next one replaces it.
	outer := t
	for _, ld := range loads {
		t.Run(ld.name, func(t *testing.T) {
			n := 0
			count := func() { n++ }
			step := func(what string, want int, f func() error) {
				t.Helper()
				n = 0
				if err := f(); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if n != want {
					t.Errorf("%s validated the configuration %d times, want %d", what, n, want)
				}
			}
			adapted := &RakeLimit{onValidate: count}
			step("UnmarshalCaddyfile", ld.adapt, func() error {
				return adapted.UnmarshalCaddyfile(caddyfile.NewTestDispenser(ld.caddyfile))
			})
			js, err := json.Marshal(adapted)
			if err != nil {
				t.Fatal(err)
			}
			r := &RakeLimit{}
			if err := json.Unmarshal(js, r); err != nil {
				t.Fatal(err)
			}
			r.onValidate = count
			ctx, err := caddy.ProvisionContext(&caddy.Config{Admin: &caddy.AdminConfig{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			step("Provision", ld.provision, func() error { return r.Provision(ctx) })
			outer.Cleanup(func() { r.Cleanup() })
			step("Validate", ld.validate, r.Validate)
			app, err := loadApp(ctx)
			if err != nil {
				t.Fatal(err)
			}
			step("Start", ld.commit, app.Start)
		})
	}
}
