// Package testutil holds what the tests of this module share, so that each
// helper exists once:
//
//   - loopback.go: UDP sockets for a test (Listen, Sender), the address
//     checks (Allowed, LoopbackFor, PortOf), and Flood and Pace, the one
//     paced sender: every send is bounded in count, optionally in time, and
//     refused unless its destination is a loopback address (127.0.0.0/8,
//     ::1) or an IPv6 ULA address (fd00::/8) of a network namespace the
//     test made;
//   - stamp.go: PutStamp and ReadStamp, the send time a Flood with Stamp
//     set writes into each datagram's last 8 bytes (a Flood also reports
//     what it sent in each second);
//   - tally.go: Tally and Receive, which count what a socket receives per
//     source and per second (a stamped datagram in the second it was sent:
//     on loopback the filter decides inside sendto, so a reader a loaded
//     machine held back still counts it in the filter's second), Drain and
//     WaitEmpty, which wait for a reader by the kernel's own state, not a
//     fixed sleep, and CheckHeld and Held, the checks that a flood was held
//     at its limit (each second against what was sent in it);
//   - quic.go: Initials, the QUIC Initial datagrams floods send, and
//     FloodInitials, the flood of them the integration tests aim at Caddy
//     (their header is quicclasstest.LongPacket's; the fixed datagrams of each
//     class are package quicclasstest's builders: LongHeader, ShortHeader,
//     Initial and the like);
//   - frames.go: Frame, the Ethernet frame of a UDP datagram over IPv4 or
//     IPv6 (options, extension headers, fragments, lengths that disagree,
//     cuts) that the kernel tests and the lab's filter benchmark feed to
//     BPF_PROG_TEST_RUN, with what a filter should read of it (Datagram,
//     Key), and IPv4Checksum;
//   - netns.go (Linux): NetNS, a network namespace of the test's own
//     (NewNetNS, removed when the test ends) with fd00::/8 addresses on its
//     loopback, Do to make sockets inside it, IP to configure it, Link,
//     a veth pair between two namespaces, and JoinNetNS, for a copy of the
//     test binary started inside one of them to reach the others by name;
//   - require.go: Required, SkipOrFail, RequireBPF and RequireRoot, the one
//     switch (CI=true or RAKELIMIT_REQUIRE_BPF=1) that turns a test's
//     missing privilege or tool from a skip into a failure;
//   - config.go: Limits and QUICLimits, the limiter configurations the bpf
//     and userspace tests start from;
//   - caddy.go: FreePort, HTTP3Get, WaitHTTP3, AdminGet, AdminRequest and
//     Metric, for tests that run Caddy and talk to it;
//   - caddyproc_linux.go: Caddy, the one starter of Caddy as a process of
//     its own (binary, a prefix such as setpriv for its user and
//     capabilities, environment, Caddyfile or JSON, log in memory or in a
//     file, waiting for the admin endpoint, a page over HTTP/3 or a check
//     of the caller's), StartCaddy for a test, Command for what runs to its
//     end, ErrorLine and LastLine for its log, and SyncBuffer; the tests of
//     cmd/caddy and the benchmark start Caddy with it (the root package's
//     tests run Caddy in their own process);
//   - process.go: Nobody, CopyTestBinary and RerunUnprivileged (with
//     Unprivileged and Tail), for tests that run this test binary again
//     without privileges, EffectiveCaps, and ThreadCaps, the capabilities
//     of each thread of a process;
//   - process_linux.go: Process, a child in a process group of its own,
//     killed with its context or this process, with Stop (SIGTERM, then
//     SIGKILL after a grace), and WaitGone;
//   - queue.go: WaitRead, which waits until Caddy has read its sockets'
//     queues (from the kernel's rx_queue, read by backlog.SocketQueued),
//     and ReadDrops, the sockets' drop counters;
//   - clock.go: Clock, a clock a test moves by hand.
//
// The lab uses it too: the filter benchmark (lab/filterbench) its frames,
// the benchmark (lab/bench) its Caddy starter and its percentiles
// (latency.go), which mean one thing in the benchmark's reports and in the
// integration tests. Nothing here registers flags, so a command may import
// it.
package testutil
