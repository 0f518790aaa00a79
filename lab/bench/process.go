//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// process is a child in a process group of its own, killed with its group
// when the context ends or when the benchmark dies (Pdeathsig), and always
// reaped.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once reaped
	err  error         // Wait's result, valid after done
}

// startProcess starts argv with env (added to nothing: the caller passes the
// whole environment) and output to out.
func startProcess(ctx context.Context, argv, env []string, out io.Writer) (*process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		// Whatever the leader left in its group goes with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.kill()
		case <-p.done:
		}
	}()
	return p, nil
}

// pid is the process's id, which is also its group's.
func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has exited and been reaped.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to the whole group.
func (p *process) kill() {
	if !p.exited() {
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	}
}

// stop sends SIGTERM and waits up to grace for the exit; then it kills the
// group. It returns how long the process took to exit after SIGTERM and
// whether it did so by itself within grace.
func (p *process) stop(grace time.Duration) (time.Duration, bool) {
	start := time.Now()
	if p.exited() {
		return 0, true
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.kill()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return time.Since(start), true
	case <-t.C:
		p.kill()
		<-p.done
		return time.Since(start), false
	}
}
