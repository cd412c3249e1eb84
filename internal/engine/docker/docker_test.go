package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/google/go-cmp/cmp"

	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/enginetest"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox"
)

func TestContainerConfig(t *testing.T) {
	const inst = "0123456789ab"
	python := engine.Language{Name: "python", File: "main.py", Command: []string{"python3"}}
	for _, tc := range []struct {
		name      string
		runtime   string
		spec      engine.Spec
		wantImage string
		wantMem   int64
		wantPids  int64
		wantNproc bool
	}{
		{
			name:      "runc defaults",
			runtime:   "runc",
			spec:      engine.Spec{ID: "exe_1", Language: python, Timeout: time.Second},
			wantImage: "vertal/default:latest",
			wantMem:   engine.DefaultMemoryBytes,
			wantPids:  engine.DefaultPids,
		},
		{
			name:    "runc with stdin, own image, plan memory",
			runtime: "runc",
			spec: engine.Spec{ID: "exe_2", Stdin: "x", Limits: engine.Limits{MemoryBytes: 512 << 20},
				Language: engine.Language{Name: "python", Image: "python:3.12", File: "main.py", Command: []string{"python3", "/code/main.py"}}},
			wantImage: "python:3.12",
			wantMem:   512 << 20,
			wantPids:  engine.DefaultPids,
		},
		{
			// gVisor: the guest's process limit is RLIMIT_NPROC, the
			// cgroup only bounds the sentry's host threads.
			name:      "runsc",
			runtime:   "runsc",
			spec:      engine.Spec{ID: "exe_3", Language: python, Limits: engine.Limits{Pids: 10}},
			wantImage: "vertal/default:latest",
			wantMem:   engine.DefaultMemoryBytes,
			wantPids:  10 * gvisorThreadsPerTask,
			wantNproc: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := configDriver(t, tc.runtime, inst)
			// Complete, as the driver gets it, but without the sandbox's
			// own deadline: Cmd is then the command alone.
			tc.spec = enginetest.Complete(tc.spec)
			tc.spec.Limits.Lifetime = 0
			cfg, host := d.containerConfig(tc.spec, "/run/v/"+inst+"/"+tc.spec.ID, 42, 2_000_000_042)

			wantCfg := &container.Config{
				Image:        tc.wantImage,
				Cmd:          []string{"python3", "/code/main.py"},
				Entrypoint:   []string{},
				Env:          sandbox.EnvFor(tc.spec.Limits),
				User:         "2000000042:2000000042",
				WorkingDir:   "/code",
				Hostname:     "sandbox",
				AttachStdin:  true, // always a pipe: see containerConfig
				OpenStdin:    true,
				StdinOnce:    true,
				AttachStdout: true,
				AttachStderr: true,
				Labels: map[string]string{
					"vertal.sandbox": "1", "vertal.instance": inst, "vertal.owner": "/run/v/" + inst + ".lock",
					"vertal.execution": tc.spec.ID, "vertal.pid": "42",
				},
			}
			ulimits := []*container.Ulimit{
				{Name: "fsize", Soft: 1 << 20, Hard: 1 << 20},
				{Name: "core"},
				{Name: "nofile", Soft: 1024, Hard: 1024},
			}
			if tc.wantNproc {
				ulimits = append(ulimits, &container.Ulimit{Name: "nproc", Soft: tc.spec.Limits.Pids, Hard: tc.spec.Limits.Pids})
			}
			init := true
			labels := wantCfg.Labels
			tmpOpts := "rw,noexec,nosuid,nodev,mode=1777,size=16777216"
			shmOpts := fmt.Sprintf("rw,noexec,nosuid,nodev,mode=1777,size=%d", min(64<<20, tc.wantMem/4))
			wantHost := &container.HostConfig{
				Runtime:        tc.runtime,
				Init:           &init,
				NetworkMode:    "none",
				IpcMode:        "none",
				CgroupnsMode:   "private",
				ReadonlyRootfs: true,
				OomScoreAdj:    engine.SandboxOOMScore,
				Mounts: []mount.Mount{{
					Type: mount.TypeBind, Source: "/run/v/" + inst + "/" + tc.spec.ID, Target: "/code",
				}},
				CapDrop:       []string{"ALL"},
				SecurityOpt:   []string{"no-new-privileges", "seccomp=" + d.policy.Seccomp},
				MaskedPaths:   sandbox.MaskedPaths(),
				ReadonlyPaths: sandbox.ReadonlyPaths(),
				LogConfig:     container.LogConfig{Type: "none"},
				Resources: container.Resources{
					CgroupParent: "/vertal-docker_" + inst + "_" + tc.spec.ID,
					// cgroup v1 (the zero accounting): the parent cgroup
					// holds the limit, the container oomMargin more.
					Memory:     tc.wantMem + oomMargin,
					MemorySwap: tc.wantMem + oomMargin,
					NanoCPUs:   1e9,
					PidsLimit:  &tc.wantPids,
					Ulimits:    ulimits,
				},
			}
			if tc.runtime == "runsc" {
				wantHost.Mounts = append(wantHost.Mounts, mount.Mount{Type: mount.TypeVolume, Target: "/tmp", VolumeOptions: &mount.VolumeOptions{
					Labels:       labels,
					DriverConfig: &mount.Driver{Name: "local", Options: map[string]string{"type": "tmpfs", "device": "tmpfs", "o": tmpOpts}},
				}}, mount.Mount{Type: mount.TypeVolume, Target: "/dev/shm", VolumeOptions: &mount.VolumeOptions{
					Labels:       labels,
					DriverConfig: &mount.Driver{Name: "local", Options: map[string]string{"type": "tmpfs", "device": "tmpfs", "o": shmOpts}},
				}})
			} else {
				wantHost.Tmpfs = map[string]string{"/tmp": tmpOpts, "/dev/shm": shmOpts}
			}
			if diff := cmp.Diff(wantCfg, cfg); diff != "" {
				t.Errorf("container config (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(wantHost, host); diff != "" {
				t.Errorf("host config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSeccompProfileIsDockers checks the profile survives Docker's own
// parsing rules: the fields Docker reads must be where it reads them.
// TestNewUnreachable needs no Docker engine: the error must say what to do.
func TestNewUnreachable(t *testing.T) {
	_, err := New(context.Background(), Options{Host: "unix://" + filepath.Join(t.TempDir(), "no.sock"), StateDir: t.TempDir()})
	if !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "scripts/dockerd.sh") {
		t.Errorf("New with no engine: %v; want ErrUnavailable saying how to start one", err)
	}
}

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"exe_0123abcd": true, "a": true, "A.b-c_d": true, strings.Repeat("x", 128): true,
		"": false, ".": false, "..": false, "_x": false, "a/b": false, "a b": false, strings.Repeat("x", 129): false,
	} {
		if got := validID(id); got != want {
			t.Errorf("validID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestCommand(t *testing.T) {
	for _, tc := range []struct {
		cmd  []string
		want []string
	}{
		{[]string{"python3"}, []string{"python3", "/code/main.py"}},
		{[]string{"python3", "/code/main.py"}, []string{"python3", "/code/main.py"}},
		{[]string{"python3", "-X", "utf8"}, []string{"python3", "-X", "utf8", "/code/main.py"}},
	} {
		got := command(engine.Language{File: "main.py", Command: tc.cmd})
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("command(%q) (-want +got):\n%s", tc.cmd, diff)
		}
	}
}

func TestSeccompProfileIsDockers(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		pol, err := newPolicy(rt)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			DefaultAction   string   `json:"defaultAction"`
			DefaultErrnoRet *uint    `json:"defaultErrnoRet"`
			Architectures   []string `json:"architectures"`
			Syscalls        []struct {
				Names  []string `json:"names"`
				Action string   `json:"action"`
			} `json:"syscalls"`
		}
		if err := json.Unmarshal([]byte(pol.Seccomp), &p); err != nil {
			t.Fatalf("%s: profile is not JSON: %v", rt, err)
		}
		if p.DefaultAction != "SCMP_ACT_ERRNO" || p.DefaultErrnoRet == nil || !slices.Contains(p.Architectures, "SCMP_ARCH_X86_64") {
			t.Errorf("%s: profile head %q errno %v arches %v", rt, p.DefaultAction, p.DefaultErrnoRet, p.Architectures)
		}
		for _, sc := range p.Syscalls {
			if sc.Action == "SCMP_ACT_ALLOW" && slices.Contains(sc.Names, "io_uring_setup") {
				t.Errorf("%s: profile allows io_uring_setup", rt)
			}
		}
	}
}

func TestAccounting(t *testing.T) {
	for _, tc := range []struct {
		name     string
		v2       bool
		systemd  bool
		files    map[string]string
		wantCPU  float64
		wantPeak int64
		wantDirs []string // cgroup directories to create and see removed
	}{
		{
			name: "v1",
			files: map[string]string{
				"cpuacct/vertal-docker_i_exe_1/cpuacct.usage":            "1500000000\n",
				"memory/vertal-docker_i_exe_1/memory.max_usage_in_bytes": "104857600\n",
			},
			wantCPU:  1.5,
			wantPeak: 100 << 20,
			wantDirs: []string{"pids/vertal-docker_i_exe_1/abc", "cpu/vertal-docker_i_exe_1"},
		},
		{
			name: "v2",
			v2:   true,
			files: map[string]string{
				"vertal-docker_i_exe_1/cpu.stat":    "usage_usec 250000\nuser_usec 200000\n",
				"vertal-docker_i_exe_1/memory.peak": "2048\n",
			},
			wantCPU:  0.25,
			wantPeak: 2048,
		},
		{
			name:    "v2, systemd driver",
			v2:      true,
			systemd: true,
			files: map[string]string{
				"vertal.slice/vertal-docker_i_exe_1.slice/cpu.stat":    "usage_usec 250000\nuser_usec 200000\n",
				"vertal.slice/vertal-docker_i_exe_1.slice/memory.peak": "2048\n",
			},
			wantCPU:  0.25,
			wantPeak: 2048,
			wantDirs: []string{"vertal.slice/vertal-docker_i_exe_1.slice"},
		},
		{
			name:  "files missing",
			files: map[string]string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			a := &accounting{root: root, v2: tc.v2, systemd: tc.systemd}
			// Stopping a slice makes systemd remove its cgroup.
			a.stopUnit = func(name string) error { return os.RemoveAll(filepath.Join(root, sliceParent, name)) }
			for name, content := range tc.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cpu, peak := a.usage("i", "exe_1")
			if cpu != tc.wantCPU || peak != tc.wantPeak {
				t.Errorf("usage() = %v s, %d bytes; want %v s, %d bytes", cpu, peak, tc.wantCPU, tc.wantPeak)
			}

			for _, dir := range tc.wantDirs {
				if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if len(tc.wantDirs) == 0 {
				return
			}
			if diff := cmp.Diff([]string{"exe_1"}, a.leftovers("i")); diff != "" {
				t.Errorf("leftovers (-want +got):\n%s", diff)
			}
			// Real cgroup directories lose their files with rmdir; in
			// this fake only the empty ones can go.
			for name := range tc.files {
				os.Remove(filepath.Join(root, name))
			}
			if err := a.remove("i", "exe_1"); err != nil {
				t.Fatalf("remove: %v", err)
			}
			if left := a.leftovers("i"); len(left) != 0 {
				t.Errorf("after remove, leftovers %v", left)
			}
		})
	}
}

// TestSliceParent: with the systemd driver a dash in a slice's name means
// nesting, so an execution id's dashes are escaped, and leftovers undoes it.
func TestSliceParent(t *testing.T) {
	root := t.TempDir()
	a := &accounting{root: root, v2: true, systemd: true}
	for _, tc := range []struct{ id, want string }{
		{"exe_1", "vertal-docker_i_exe_1.slice"},
		{"exe-1.a", `vertal-docker_i_exe\x2d1.a.slice`},
	} {
		if got := a.parent("i", tc.id); got != tc.want {
			t.Errorf("parent(i, %q) = %q; want %q", tc.id, got, tc.want)
		}
		if err := os.MkdirAll(filepath.Join(root, sliceParent, tc.want), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got := a.leftovers("i")
	slices.Sort(got)
	if diff := cmp.Diff([]string{"exe-1.a", "exe_1"}, got); diff != "" {
		t.Errorf("leftovers (-want +got):\n%s", diff)
	}
}
