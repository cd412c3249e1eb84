package sandbox

import (
	"bytes"
	"encoding/binary"
	"fmt"
	goruntime "runtime"
	"slices"

	"github.com/elastic/go-seccomp-bpf/arch"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
)

// CompileSeccomp compiles an OCI seccomp filter (the profile Seccomp
// returns) to a classic BPF program, the sock_filter array that
// seccomp(2) and bubblewrap's --seccomp take, in native byte order. The
// OCI runtimes compile the profile with libseccomp inside every sandbox;
// a launcher without libseccomp (bubblewrap) gets it compiled once.
//
// The instructions are golang.org/x/net/bpf's and the system call table
// github.com/elastic/go-seccomp-bpf's (generated from the kernel's); the
// program's layout is ours (seccompProgram). go-seccomp-bpf v1.6.0's own
// assembler was tried first: after an argument comparison fails it goes
// on to the next rule without reloading the system call number, so the
// next rules compare an argument with system call numbers (socket with
// AF_PACKET, 17, would match pread64's rule and be allowed).
// libseccomp-golang needs cgo.
//
// Two things differ from libseccomp, both no weaker: a system call of
// another architecture returns the default action (ENOSYS) and one of
// the x32 ABI ENOSYS, where libseccomp kills the thread; and a profile
// that gives one system call rules with different actions is refused
// rather than ordered by libseccomp's precedence.
func CompileSeccomp(s *specs.LinuxSeccomp) ([]byte, error) {
	prog, err := seccompProgram(s)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	var b bytes.Buffer
	for _, ins := range raw {
		_ = binary.Write(&b, binary.NativeEndian, ins) // struct sock_filter
	}
	return b.Bytes(), nil
}

// seccompProgram is the filter as instructions, for CompileSeccomp and
// for tests that run it. Its shape:
//
//	load arch; not native: return default
//	load nr; x32 entry point (nr >= X32 bit): return ENOSYS
//	per unconditional system call: nr equal: return its action
//	per conditional system call: nr not equal: skip the block; else for
//	each rule (OR) its comparisons (AND), a rule that holds returns the
//	action; none: return default; after the block reload nr
//	return default
//
// A system call has one action (refused otherwise), so a conditional
// system call whose rules all fail gets the default action, as with
// libseccomp. The layout is linear (two instructions a system call);
// the most used calls come first in the profile.
func seccompProgram(s *specs.LinuxSeccomp) ([]bpf.Instruction, error) {
	if s == nil {
		return nil, fmt.Errorf("seccomp: no filter")
	}
	table, auditArch, err := nativeSyscalls(s.Architectures)
	if err != nil {
		return nil, err
	}
	if len(s.Flags) > 0 || s.ListenerPath != "" {
		return nil, fmt.Errorf("seccomp: flags and listeners are not supported")
	}
	def, err := seccompAction(s.DefaultAction, s.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp: default action: %w", err)
	}
	type conditional struct {
		nr   uint32
		act  uint32
		sets [][]specs.LinuxSeccompArg
	}
	var (
		plain   []bpf.Instruction
		conds   []*conditional
		byName  = map[string]*conditional{}
		actOf   = map[string]uint32{}
		uncondl = map[string]bool{}
	)
	for i, rule := range s.Syscalls {
		act, err := seccompAction(rule.Action, rule.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("seccomp: rule %d %v: %w", i, rule.Names, err)
		}
		for _, a := range rule.Args {
			if err := checkSeccompArg(a); err != nil {
				return nil, fmt.Errorf("seccomp: rule %d %v: %w", i, rule.Names, err)
			}
		}
		for _, name := range rule.Names {
			nr, ok := table[name]
			if !ok {
				return nil, fmt.Errorf("seccomp: rule %d: unknown system call %q", i, name)
			}
			if prev, ok := actOf[name]; ok && (prev != act || uncondl[name] || len(rule.Args) == 0) {
				return nil, fmt.Errorf("seccomp: %s has more than one rule that differ in action or conditions", name)
			}
			actOf[name] = act
			if len(rule.Args) == 0 {
				uncondl[name] = true
				plain = append(plain,
					bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipFalse: 1},
					bpf.RetConstant{Val: act})
				continue
			}
			c := byName[name]
			if c == nil {
				c = &conditional{nr: uint32(nr), act: act}
				byName[name] = c
				conds = append(conds, c)
			}
			c.sets = append(c.sets, rule.Args)
		}
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: auditArch, SkipTrue: 1},
		bpf.RetConstant{Val: def},
		bpf.LoadAbsolute{Off: 0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
		bpf.RetConstant{Val: retErrnoBase | errnoENOSYS},
	}
	prog = append(prog, plain...)
	for _, c := range conds {
		var block []bpf.Instruction
		for _, set := range c.sets {
			// Each comparison jumps to the set's end (fail) when it
			// does not hold; the set's end is its "return action".
			var checks [][]bpf.Instruction
			for _, a := range set {
				checks = append(checks, argCheck(a))
			}
			n := 0
			for _, ch := range checks {
				n += len(ch)
			}
			// Fail target: the instruction after this set's return.
			pos := 0
			for _, ch := range checks {
				for _, ins := range ch {
					pos++
					if j, ok := ins.(bpf.JumpIf); ok {
						skip := n - pos + 1 // past the remaining checks and the return
						if skip > 255 {
							return nil, fmt.Errorf("seccomp: %d comparisons on one rule", len(set))
						}
						if j.SkipTrue == failMark {
							j.SkipTrue = uint8(skip)
						}
						if j.SkipFalse == failMark {
							j.SkipFalse = uint8(skip)
						}
						ins = j
					}
					block = append(block, ins)
				}
			}
			block = append(block, bpf.RetConstant{Val: c.act})
		}
		block = append(block, bpf.RetConstant{Val: def})
		if len(block) > 255 {
			return nil, fmt.Errorf("seccomp: rules of system call %d too long", c.nr)
		}
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: c.nr, SkipFalse: uint8(len(block))})
		prog = append(prog, block...)
		// The checks loaded arguments: the next test needs nr again.
		prog = append(prog, bpf.LoadAbsolute{Off: 0, Size: 4})
	}
	prog = append(prog, bpf.RetConstant{Val: def})
	if len(prog) > 4096 {
		return nil, fmt.Errorf("seccomp: %d instructions, over the kernel's 4096", len(prog))
	}
	return prog, nil
}

// failMark in a jump of argCheck stands for "to the rule's end".
const failMark = 0xff

// Seccomp return values and offsets (linux/seccomp.h, linux/audit.h).
const (
	retKillProcess = 0x80000000
	retKillThread  = 0x00000000
	retErrnoBase   = 0x00050000
	retAllow       = 0x7fff0000
	x32SyscallBit  = 0x40000000
	argOffset      = 16 // seccomp_data.args
)

// argCheck compares one 64-bit argument in two 32-bit halves; a jump
// whose target is failMark leaves the rule. The halves' offsets are
// little-endian (x86_64, arm64).
func argCheck(a specs.LinuxSeccompArg) []bpf.Instruction {
	lo := bpf.LoadAbsolute{Off: argOffset + 8*uint32(a.Index), Size: 4}
	hi := bpf.LoadAbsolute{Off: argOffset + 8*uint32(a.Index) + 4, Size: 4}
	vhi, vlo := uint32(a.Value>>32), uint32(a.Value)
	switch a.Op {
	case specs.OpEqualTo:
		return []bpf.Instruction{hi, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vhi, SkipFalse: failMark},
			lo, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vlo, SkipFalse: failMark}}
	case specs.OpNotEqual:
		// hi differs: holds (skip the lo test); else lo must differ.
		return []bpf.Instruction{hi, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vhi, SkipFalse: 2},
			lo, bpf.JumpIf{Cond: bpf.JumpEqual, Val: vlo, SkipTrue: failMark}}
	case specs.OpMaskedEqual: // (arg & mask) == 0, checkSeccompArg made sure of 0
		return []bpf.Instruction{hi, bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: vhi, SkipTrue: failMark},
			lo, bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: vlo, SkipTrue: failMark}}
	}
	panic("argCheck: unchecked operator " + string(a.Op))
}

// checkSeccompArg accepts the comparisons argCheck compiles.
func checkSeccompArg(a specs.LinuxSeccompArg) error {
	if a.Index > 5 {
		return fmt.Errorf("argument %d out of range", a.Index)
	}
	switch a.Op {
	case specs.OpEqualTo, specs.OpNotEqual:
		if a.ValueTwo != 0 {
			return fmt.Errorf("argument %d: valueTwo is only meaningful for %s", a.Index, specs.OpMaskedEqual)
		}
		return nil
	case specs.OpMaskedEqual:
		if a.ValueTwo != 0 {
			return fmt.Errorf("argument %d: masked equal to %#x is not supported (only to 0)", a.Index, a.ValueTwo)
		}
		return nil
	}
	return fmt.Errorf("argument %d: operator %s is not supported", a.Index, a.Op)
}

// nativeSyscalls is the system call table of the one architecture a
// profile may name, the native one.
func nativeSyscalls(archs []specs.Arch) (map[string]int, uint32, error) {
	if !slices.Equal(archs, nativeArch()) {
		return nil, 0, fmt.Errorf("seccomp: architectures %v: only the native %v is supported", archs, nativeArch())
	}
	info, err := arch.GetInfo("")
	if err != nil || info.SeccompMask != 0 && info.SeccompMask != x32SyscallBit {
		return nil, 0, fmt.Errorf("seccomp: no system call table for %s: %v", goruntime.GOARCH, err)
	}
	return info.SyscallNames, uint32(info.ID), nil
}

// seccompAction maps an OCI action to a return value of the filter.
func seccompAction(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return retAllow, nil
	case specs.ActErrno:
		errno := uint(errnoEPERM) // the runtime-spec default
		if errnoRet != nil {
			errno = *errnoRet
		}
		if errno == 0 || errno > 0xffff {
			return 0, fmt.Errorf("errno %d out of range", errno)
		}
		return retErrnoBase | uint32(errno), nil
	case specs.ActKillProcess:
		return retKillProcess, nil
	case specs.ActKill, specs.ActKillThread:
		return retKillThread, nil
	}
	return 0, fmt.Errorf("action %s is not supported", a)
}
