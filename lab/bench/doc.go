//go:build linux

// Package bench is the end-to-end benchmark behind lab/cmd/rakebench: it runs a
// real Caddy (the binary of ./cmd/caddy) once per variant and scenario, on
// loopback only, and measures what an operator feels: legitimate HTTP/3
// clients during floods, heavy transfers without one, and the server's side
// (CPU, memory, the module's verdicts, socket drops, replies to the flood).
//
// A variant is data: a name and the Caddyfile directive text placed in the
// site block ("plain" has none and is the reference for every ratio). The
// files split by concern:
//
//   - options.go: flags, variants, validation
//   - scenarios.go: the scenarios and their flood sources
//   - caddy.go: the Caddy process (started by internal/testutil's Caddy,
//     the tests' starter too), its configuration and probes from /proc
//     (CPU, peak RSS; socket drops through internal/engine/backlog)
//   - metrics.go: the module's Prometheus counters, parsed generically
//   - packets.go, flood.go: flood datagrams and their bounded senders
//   - spoof.go: spoofed floods, whole IPv4 datagrams from a raw socket
//   - attack.go: the attacks on verification: the attacker's own
//     connection and the server ID it reads, real first flights that
//     quic-go answers, the warm-up that sends them from spoofed addresses
//   - proofs.go: the attacks on proofs: bots that prove their addresses,
//     the attacker's path probes from a victim's address over a socket
//     that never reads, and the opening total's timeline
//   - clients.go: the legitimate HTTP/3 clients and gtlsclient
//   - transfers.go: the downloads, the upload and its backend
//   - stats.go: medians and ratios (percentiles: internal/testutil)
//   - run.go: the run of every scenario, variant and repetition, and
//     Rerender
//   - setup.go: Caddy's binary, the machine, ports and the files served
//   - runone.go: one scenario and variant on a fresh Caddy, and the
//     server's side of the measured window
//   - measure.go: what runs in the window: the flood with the attacker's
//     connection and the warm-up, the clients, gtlsclient, the transfers
//   - report.go: the figures, their medians and ratios, and the outputs
//     (results.json)
//   - markdown.go: results.md
//   - readme.go: the README's bench section
//   - charts.go: the SVG charts
//   - summary.go: what the terminal shows: the time left, and the table
//     printed at the end of a run
//   - dashboard.go: the Grafana dashboard rendered from a scenario's scrapes
//
// Network rule: every datagram goes to a loopback address (127.0.0.0/8 or
// ::1), from sockets bound to the loopback address they claim or, for a
// spoofed flood, from a raw socket that writes sources in 127.0.0.0/8 only,
// and every flood is bounded by a count and a duration.
package bench
