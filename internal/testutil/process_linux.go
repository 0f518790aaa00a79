package testutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a child in a process group of its own, killed with its group
// when its context ends or when this process dies (Pdeathsig), and always
// reaped.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once reaped
	err  error         // Wait's result, valid after done
}

// StartProcess starts argv with env (the whole environment: nothing is
// inherited) and its standard output and error to out (nil: discarded).
func StartProcess(ctx context.Context, argv, env []string, out io.Writer) (*Process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		// Whatever the leader left in its group goes with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.Kill()
		case <-p.done:
		}
	}()
	return p, nil
}

// Pid is the process's id, which is also its group's.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is how the process ended (exec.Cmd.Wait's error), once Done is
// closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Exited reports whether the process has exited and been reaped.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process (not its group); a process that has
// exited is not signalled.
func (p *Process) Signal(sig os.Signal) error {
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling process %d: %w", p.Pid(), err)
	}
	return nil
}

// Kill sends SIGKILL to the whole group.
func (p *Process) Kill() {
	if !p.Exited() {
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	}
}

// Stop sends SIGTERM and waits up to grace for the exit; then it kills the
// group. It returns how long the process took to exit after SIGTERM and
// whether it did so by itself within grace.
func (p *Process) Stop(grace time.Duration) (time.Duration, bool) {
	start := time.Now()
	if p.Exited() {
		return 0, true
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.Kill()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return time.Since(start), true
	case <-t.C:
		p.Kill()
		<-p.done
		return time.Since(start), false
	}
}

// WaitGone waits up to within for process pid to be gone (no such process,
// or a zombie) and reports whether it is.
func WaitGone(pid int, within time.Duration) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		if !alive(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	return !strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "Z")
}
