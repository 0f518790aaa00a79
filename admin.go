package rakelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/rakelimit/caddy-rakelimit/internal/engine"
)

// Admin serves GET /rakelimit/ on Caddy's admin endpoint: the report of
// every limiter (package report): the listeners it protects, its settings,
// its counters and the streams it limits now, the fastest first. It has
// nothing to configure.
type Admin struct {
	// registry holds the limiters it reports.
	registry *engine.Registry
}

// CaddyModule returns the Caddy module information. The module registered
// carries the registry, and so does every instance Caddy makes of it.
func (a Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.rakelimit",
		New: func() caddy.Module { return &Admin{registry: a.registry} },
	}
}

// Routes returns the admin routes.
func (a Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/rakelimit/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// serve encodes the registry's report.
func (a Admin) serve(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	if a.registry == nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: errors.New("the rakelimit admin module has no registry")}
	}
	v, err := a.registry.Report()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*Admin)(nil)
)
