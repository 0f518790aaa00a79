// Package testutil holds what the tests of this module share, so that each
// helper exists once:
//
//   - loopback.go: UDP sockets for a test (Listen, Sender), the address
//     checks (Allowed, LoopbackFor, PortOf), and Flood and Pace, the one
//     paced sender: every send is bounded in count, optionally in time, and
//     refused unless its destination is a loopback address (127.0.0.0/8,
//     ::1) or an IPv6 ULA address (fd00::/8) of a network namespace the
//     test made;
//   - tally.go: Tally and Receive, which count what a socket receives per
//     source and per second, and CheckHeld and Held, the checks that a
//     flood was held at its limit;
//   - quic.go: Initials, the QUIC Initial datagrams floods send, and
//     FloodInitials, the flood of them the integration tests aim at Caddy
//     (the fixed datagrams of each class are quicclass.LongHeader and
//     quicclass.ShortHeader);
//   - require.go: Required, SkipOrFail, RequireBPF and RequireRoot, the one
//     switch (CI=true or RAKELIMIT_REQUIRE_BPF=1) that turns a test's
//     missing privilege or tool from a skip into a failure;
//   - config.go: Limits and QUICLimits, the limiter configurations the bpf
//     and userspace tests start from;
//   - caddy.go: FreePort, HTTP3Get, WaitHTTP3, AdminGet and Metric, for
//     tests that run Caddy and talk to it;
//   - process.go: Nobody and CopyTestBinary, for tests that run this test
//     binary again without privileges.
//
// The kernel's own counters of UDP drops are read by package procnet, and
// latency percentiles computed by package latency: both are shared with the
// benchmark (internal/bench), which must not import this package, since it
// imports testing.
package testutil
