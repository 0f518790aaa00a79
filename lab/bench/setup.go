//go:build linux

package bench

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// setup finds or builds Caddy, picks ports, writes the files, starts the
// upload backend and validates every variant.
func (b *bench) setup(ctx context.Context, rep *Report) error {
	o := b.o
	var err error
	if o.Dashboard != "" {
		if b.dash, err = loadDashboard(); err != nil {
			return err
		}
	}
	if o.Caddy != "" {
		if st, err := os.Stat(o.Caddy); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("-caddy %s: not an executable file", o.Caddy)
		}
		b.bin = o.Caddy
	} else if b.bin, err = buildCaddy(ctx, b.dir, b.progress); err != nil {
		return err
	}
	rep.Machine = machine()
	if o.Caddy == "" {
		// When go build does not stamp the revision (-buildvcs=false),
		// ask git.
		rep.Machine.Revision, rep.Notes = gitRevision(ctx)
	}
	if rep.Machine.Caddy, err = caddyVersion(ctx, b.bin); err != nil {
		return err
	}
	if info, err := buildinfo.ReadFile(b.bin); err == nil {
		rep.Machine.Go = info.GoVersion
		var mods []string
		for _, d := range info.Deps {
			if d.Path == "github.com/quic-go/quic-go" || d.Path == "github.com/cilium/ebpf" {
				mods = append(mods, d.Path+" "+d.Version)
			}
		}
		rep.Machine.Modules = strings.Join(mods, ", ")
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				rep.Machine.Revision = s.Value
			}
			if s.Key == "vcs.modified" && s.Value == "true" && len(rep.Notes) == 0 {
				rep.Notes = append(rep.Notes, dirtyNote)
			}
		}
	}
	rep.Machine.Gtlsclient = "off"
	if o.Gtls != GtlsOff {
		if b.gtls, err = exec.LookPath("gtlsclient"); err != nil {
			if o.Gtls == GtlsRequire {
				return errors.New("-gtlsclient require: gtlsclient is not installed (Debian package ngtcp2-client)")
			}
			b.gtls, rep.Machine.Gtlsclient = "", "not installed"
		} else {
			rep.Machine.Gtlsclient = "installed"
		}
	}
	s := site{port: o.Port, adminPort: o.AdminPort, storage: filepath.Join(b.dir, "storage"), www: filepath.Join(b.dir, "www")}
	if s.port != 0 {
		if err := checkPortFree("-port", s.port, true); err != nil {
			return err
		}
	} else if s.port, err = freePort(s.adminPort); err != nil {
		return err
	}
	if s.adminPort != 0 {
		if err := checkPortFree("-admin-port", s.adminPort, false); err != nil {
			return err
		}
	} else if s.adminPort, err = freePort(s.port); err != nil {
		return err
	}
	if s.httpPort, err = freePort(s.port, s.adminPort); err != nil {
		return err
	}
	if b.backend, err = startBackend(); err != nil {
		return err
	}
	s.backendPort = b.backend.port
	b.site = s
	sizes := transferSizes{Download: 1, Each: 1}
	for _, sc := range o.Scenarios {
		if sc.Transfers {
			sizes = b.sizes
			fmt.Fprintf(b.progress, "rakebench: writing %d MB of files to serve\n", (sizes.Download+sizes.Each)/1e6)
		}
	}
	if err := writeFiles(s.www, sizes); err != nil {
		b.backend.close()
		return err
	}
	for _, v := range o.Variants {
		if err := validateVariant(ctx, b.bin, b.dir, s, v); err != nil {
			b.backend.close()
			return err
		}
	}
	rep.Settings = Settings{
		Reps: o.Reps, Scale: o.Scale, TransferScale: o.TransferScale,
		FloodSeconds: o.floodDuration().Seconds(), FloodMax: o.FloodMax,
		RequestRate: requestRate, TimeoutSeconds: o.Timeout.Seconds(), GtlsFetches: gtlsFetches,
		Sizes: b.sizes, StallSeconds: o.stallTimeout().Seconds(),
		TransferTimeoutSeconds: o.transferTimeout().Seconds(), StopTimeoutSeconds: o.stopTimeout().Seconds(),
		FloodStopTimeoutSeconds: o.floodStopTimeout().Seconds(),
	}
	if b.gtls == "" {
		rep.Settings.GtlsFetches = 0
	}
	return nil
}

const dirtyNote = "Caddy was built from a work tree with uncommitted changes."

// gitRevision returns the commit of the repository in the working directory
// and a note when the work tree has changes; nothing when git cannot tell.
func gitRevision(ctx context.Context) (string, []string) {
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", nil
	}
	rev := strings.TrimSpace(string(out))
	status, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output()
	if err == nil && len(bytes.TrimSpace(status)) > 0 {
		return rev, []string{dirtyNote}
	}
	return rev, nil
}

// machine describes this machine.
func machine() Machine {
	m := Machine{Cores: runtime.NumCPU(), CPU: "unknown", Kernel: "unknown"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + string(bytes.TrimSpace(b))
	}
	return m
}
