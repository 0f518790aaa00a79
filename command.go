package rakelimit

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/rakelimit/caddy-rakelimit/internal/console"
	"github.com/rakelimit/caddy-rakelimit/internal/engine/report"
)

// init registers `caddy rakelimit status` and `caddy rakelimit top`: Caddy
// takes its subcommands from modules' init functions.
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rakelimit",
		Usage: "status|top [--address <interface>] [--config <path> [--adapter <name>]]",
		Short: "Shows what rakelimit is doing in a running Caddy",
		Long: `
Reads GET /rakelimit/ from the admin endpoint of a running Caddy and shows
each limiter: its mode per listener, the settings in force, packets per
second by class and verdict, the limited streams fastest first, and a
one-line verdict.

  status  one screen, with rates over --interval (default 1s)
  top     the same, refreshed every --interval until interrupted (Ctrl-C),
          sized to the terminal; plain text when not a terminal

The admin endpoint is --address, else the one in --config, else
localhost:2019, as for caddy reload and caddy stop.`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.AddCommand(consoleCommand("status", "Shows one screen of what rakelimit is doing", false))
			cmd.AddCommand(consoleCommand("top", "Shows what rakelimit is doing, refreshed every second", true))
		},
	})
}

// consoleCommand is the status or top subcommand.
func consoleCommand(name, short string, live bool) *cobra.Command {
	cmd := &cobra.Command{Use: name, Short: short, Args: cobra.NoArgs}
	cmd.Flags().String("address", "", "The address of the admin endpoint, if not the default")
	cmd.Flags().StringP("config", "c", "", "Configuration file to read the admin address from, if --address is not used")
	cmd.Flags().StringP("adapter", "a", "", "Name of the config adapter of --config")
	cmd.Flags().Duration("interval", time.Second, "Time between two readings: the rates' period, and top's refresh")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cmd.SilenceUsage = true // from here on, errors are not about the flags
		f := cmd.Flags()
		address, _ := f.GetString("address")
		config, _ := f.GetString("config")
		adapter, _ := f.GetString("adapter")
		interval, _ := f.GetDuration("interval")
		if interval < 100*time.Millisecond {
			return fmt.Errorf("--interval %v: want at least 100ms", interval)
		}
		addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
		if err != nil {
			return fmt.Errorf("finding the admin endpoint: %w", err)
		}
		client, err := adminClient(addr)
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		fd := int(os.Stdout.Fd())
		opts := console.Options{Address: addr, Interval: interval, Terminal: term.IsTerminal(fd),
			Size: func() (int, int) {
				w, h, err := term.GetSize(fd)
				if err != nil {
					return 0, 0
				}
				return w, h
			}}
		fetch := func(ctx context.Context) (report.View, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return client.Fetch(ctx)
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if live {
			return console.Top(ctx, fetch, out, opts)
		}
		if !opts.Terminal {
			opts.Size = nil
		}
		return console.Status(ctx, fetch, out, opts)
	}
	return cmd
}

// adminClient makes a client of the admin endpoint at addr, which may be
// a unix socket, as Caddy's own commands reach it.
func adminClient(addr string) (console.Client, error) {
	na, err := caddy.ParseNetworkAddress(addr)
	if err != nil || na.PortRangeSize() > 1 {
		return console.Client{}, fmt.Errorf("--address %q: not an admin address (host:port or unix/path)", addr)
	}
	origin := "http://" + na.JoinHostPort(0)
	if na.IsUnixNetwork() || na.IsFdNetwork() {
		origin = "http://127.0.0.1"
	}
	network, dial := na.Network, na.JoinHostPort(0)
	if na.IsUnixNetwork() {
		// The path, without the optional |permissions suffix.
		dial, _, _ = strings.Cut(na.Host, "|")
	}
	d := net.Dialer{Timeout: 3 * time.Second}
	return console.Client{Address: addr, Origin: origin, HTTP: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, network, dial) },
	}}}, nil
}
