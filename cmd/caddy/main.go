// Command caddy is Caddy with its standard modules and rakelimit, for
// development and for the README's example:
//
//	go run ./cmd/caddy run --config testdata/Caddyfile
//
// Operators build the same with xcaddy build --with github.com/rakelimit/caddy-rakelimit.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/rakelimit/caddy-rakelimit"
)

func main() {
	caddycmd.Main()
}
