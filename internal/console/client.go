package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// Path is where the admin endpoint serves rakelimit's view.
const Path = "/rakelimit/"

// Client fetches the admin view from one admin endpoint.
type Client struct {
	// Address is the admin endpoint as the operator gave it (for
	// messages), e.g. localhost:2019 or unix//run/caddy-admin.sock.
	Address string
	// Origin is the scheme and host of requests, e.g.
	// http://localhost:2019; it is sent as the Origin header, as Caddy's
	// own commands do.
	Origin string
	// HTTP sends the requests; it dials the endpoint's network.
	HTTP *http.Client
}

// Fetch reads the admin view. Its errors are one line each, saying whether
// the endpoint is unreachable, is not a Caddy with rakelimit, or runs no
// limiter.
func (c Client) Fetch(ctx context.Context) (report.View, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Origin+Path, nil)
	if err != nil {
		return report.View{}, fmt.Errorf("admin address %q: %w", c.Address, err)
	}
	req.Header.Set("Origin", c.Origin)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return report.View{}, fmt.Errorf("cannot reach Caddy's admin endpoint at %s (is Caddy running with its admin "+
				"endpoint there? give it with --address): %v", c.Address, op.Err)
		}
		if ctx.Err() != nil {
			return report.View{}, fmt.Errorf("the admin endpoint at %s did not answer: %w", c.Address, ctx.Err())
		}
		return report.View{}, fmt.Errorf("%s is not Caddy's admin endpoint: %w", c.Address, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return report.View{}, fmt.Errorf("reading %s from %s: %w", Path, c.Address, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && c.isCaddy(ctx):
		return report.View{}, fmt.Errorf("the Caddy at %s has no rakelimit: GET %s is not found; build Caddy with "+
			"xcaddy build --with github.com/rakelimit/caddy-rakelimit", c.Address, Path)
	case resp.StatusCode != http.StatusOK:
		return report.View{}, fmt.Errorf("%s is not a Caddy with rakelimit: GET %s answered %s: %s", c.Address, Path,
			resp.Status, firstLine(body))
	}
	var v struct {
		Limiters *[]report.Limiter `json:"limiters"`
	}
	if err := json.Unmarshal(body, &v); err != nil || v.Limiters == nil {
		return report.View{}, fmt.Errorf("%s is not a Caddy with rakelimit: GET %s did not answer rakelimit's JSON: %s",
			c.Address, Path, firstLine(body))
	}
	if len(*v.Limiters) == 0 {
		return report.View{}, fmt.Errorf("the Caddy at %s runs no rakelimit: no HTTP/3 listener has the rakelimit "+
			"directive in its configuration", c.Address)
	}
	return report.View{Limiters: *v.Limiters}, nil
}

// isCaddy reports whether the endpoint answers as Caddy's admin API does:
// GET /config/ returns the configuration as JSON.
func (c Client) isCaddy(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Origin+"/config/", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Origin", c.Origin)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var cfg any
	return resp.StatusCode == http.StatusOK && json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&cfg) == nil
}

// firstLine is the start of body's first line, for a message.
func firstLine(body []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	if s == "" {
		s = "(empty)"
	}
	return s
}
