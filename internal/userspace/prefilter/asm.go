package prefilter

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// label names an instruction a jump goes to; next is the instruction that
// follows the jump.
type label int

const next label = -1

// asm assembles a classic BPF program whose jumps go to labels. Classic BPF
// jumps only forward; a conditional jump reaches at most 255 instructions,
// an unconditional one (ja) any distance. The program is laid out so that
// conditional jumps stay short (each rule jumps to its own end); assemble
// fails rather than emit a wrong offset.
type asm struct {
	ins    []bpf.Instruction
	fix    []fixup
	labels []int // instruction index by label; -1 until marked
}

// fixup is a jump whose offsets are resolved by assemble.
type fixup struct {
	at          int
	true, false label
}

func (a *asm) newLabel() label {
	a.labels = append(a.labels, -1)
	return label(len(a.labels) - 1)
}

// mark puts l on the next instruction emitted.
func (a *asm) mark(l label) { a.labels[l] = len(a.ins) }

func (a *asm) emit(ins ...bpf.Instruction) { a.ins = append(a.ins, ins...) }

// jump emits "if A cond val goto t else goto f".
func (a *asm) jump(cond bpf.JumpTest, val uint32, t, f label) {
	a.fix = append(a.fix, fixup{at: len(a.ins), true: t, false: f})
	a.ins = append(a.ins, bpf.JumpIf{Cond: cond, Val: val})
}

// jumpX emits "if A cond X goto t else goto f".
func (a *asm) jumpX(cond bpf.JumpTest, t, f label) {
	a.fix = append(a.fix, fixup{at: len(a.ins), true: t, false: f})
	a.ins = append(a.ins, bpf.JumpIfX{Cond: cond})
}

// ja emits an unconditional jump to l.
func (a *asm) ja(l label) {
	a.fix = append(a.fix, fixup{at: len(a.ins), true: l})
	a.ins = append(a.ins, bpf.Jump{})
}

// skip returns how far the jump at is from label l.
func (a *asm) skip(at int, l label) (uint32, error) {
	if l == next {
		return 0, nil
	}
	to := a.labels[l]
	if to < 0 {
		return 0, fmt.Errorf("assembling the pre-filter: label %d never marked", l)
	}
	if to <= at {
		return 0, fmt.Errorf("assembling the pre-filter: jump at %d goes back to %d", at, to)
	}
	return uint32(to - at - 1), nil
}

// conditional returns the true and false skips of the conditional jump f,
// whose true skip is t: each must fit a classic BPF jump's 8 bits.
func (a *asm) conditional(f fixup, t uint32) (uint8, uint8, error) {
	ft, err := a.skip(f.at, f.false)
	if err != nil {
		return 0, 0, err
	}
	if t > 255 || ft > 255 {
		return 0, 0, fmt.Errorf("assembling the pre-filter: conditional jump at %d skips %d/%d instructions, over 255", f.at, t, ft)
	}
	return uint8(t), uint8(ft), nil
}

// resolve sets every jump's offsets and returns the instructions.
func (a *asm) resolve() ([]bpf.Instruction, error) {
	for _, f := range a.fix {
		t, err := a.skip(f.at, f.true)
		if err != nil {
			return nil, err
		}
		switch ins := a.ins[f.at].(type) {
		case bpf.Jump:
			ins.Skip = t
			a.ins[f.at] = ins
			continue
		case bpf.JumpIf:
			if ins.SkipTrue, ins.SkipFalse, err = a.conditional(f, t); err != nil {
				return nil, err
			}
			a.ins[f.at] = ins
		case bpf.JumpIfX:
			if ins.SkipTrue, ins.SkipFalse, err = a.conditional(f, t); err != nil {
				return nil, err
			}
			a.ins[f.at] = ins
		}
	}
	return a.ins, nil
}
