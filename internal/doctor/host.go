package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/image"
)

// HostOptions say what to check on the host.
type HostOptions struct {
	// Driver is "oci" or "docker".
	Driver string
	// Runtime is the runtime asked for; empty means the oci driver's
	// preference (crun, then runc).
	Runtime string
	// ImageDir holds rootfs/ and versions.json of the default image.
	ImageDir string
	// Images are the other configured images' directories by name; each
	// is checked as the default one is.
	Images map[string]string
	// CgroupRoot is where cgroups are mounted. Default /sys/fs/cgroup.
	CgroupRoot string

	// Seams for tests; nil means the real ones.
	Geteuid  func() int
	LookPath func(string) (string, error)
	// Version runs `<runtime> --version`.
	Version func(ctx context.Context, path string) (string, error)
}

// HostChecks inspects the machine: privileges, cgroups, the runtime and
// the image.
func HostChecks(ctx context.Context, o HostOptions) []Check {
	if o.CgroupRoot == "" {
		o.CgroupRoot = "/sys/fs/cgroup"
	}
	if o.Geteuid == nil {
		o.Geteuid = os.Geteuid
	}
	if o.LookPath == nil {
		o.LookPath = exec.LookPath
	}
	if o.Version == nil {
		o.Version = runtimeVersion
	}
	var checks []Check
	checks = append(checks, rootCheck(o))
	cg := ReadCgroups(o.CgroupRoot)
	checks = append(checks, cgroupChecks(o, cg)...)
	if o.Driver == "oci" {
		checks = append(checks, runtimeCheck(ctx, o, cg))
	}
	checks = append(checks, imageChecks(o, "", o.ImageDir)...)
	for _, name := range sortedKeys(o.Images) {
		checks = append(checks, imageChecks(o, name, o.Images[name])...)
	}
	return checks
}

func rootCheck(o HostOptions) Check {
	c := Check{Group: "host", Name: "privileges", Essential: o.Driver == "oci"}
	uid := o.Geteuid()
	switch {
	case uid == 0:
		c.Status, c.Detail = StatusOK, "running as root"
	case o.Driver == "oci":
		c.Status, c.Detail = StatusFail, fmt.Sprintf("running as uid %d", uid)
		c.Fix = "the oci driver creates namespaces, cgroups and mounts: run vertal as root"
	default:
		c.Status, c.Detail = StatusWarn, fmt.Sprintf("running as uid %d", uid)
		c.Fix = "the docker driver needs access to the Docker socket (root or the docker group)"
	}
	return c
}

// Cgroups describes the host's cgroup setup.
type Cgroups struct {
	// Mode is "v2" (unified), "hybrid" (v1 controllers plus a unified
	// hierarchy) or "v1"; "" when no cgroup filesystem was found.
	Mode string
	// Controllers usable for sandboxes (memory, pids, cpu, …).
	Controllers []string
	// UnifiedControllers are controllers held by the unified hierarchy in
	// hybrid mode, which crun refuses to work with.
	UnifiedControllers []string
}

// ReadCgroups looks at the cgroup mount under root.
func ReadCgroups(root string) Cgroups {
	if b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil {
		return Cgroups{Mode: "v2", Controllers: strings.Fields(string(b))}
	}
	var cg Cgroups
	for _, c := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices", "freezer", "hugetlb"} {
		if _, err := os.Stat(filepath.Join(root, c, "cgroup.procs")); err == nil {
			cg.Controllers = append(cg.Controllers, c)
		}
	}
	if len(cg.Controllers) == 0 {
		return cg
	}
	cg.Mode = "v1"
	if b, err := os.ReadFile(filepath.Join(root, "unified", "cgroup.controllers")); err == nil {
		cg.Mode = "hybrid"
		cg.UnifiedControllers = strings.Fields(string(b))
	}
	return cg
}

func cgroupChecks(o HostOptions, cg Cgroups) []Check {
	c := Check{Group: "host", Name: "cgroups", Essential: true}
	if cg.Mode == "" {
		c.Status, c.Detail = StatusFail, "no cgroup filesystem at "+o.CgroupRoot
		c.Fix = "mount cgroup2 at /sys/fs/cgroup (mount -t cgroup2 none /sys/fs/cgroup)"
		return []Check{c}
	}
	var missing []string
	for _, need := range []string{"memory", "pids", "cpu"} {
		if !slices.Contains(cg.Controllers, need) {
			missing = append(missing, need)
		}
	}
	c.Detail = fmt.Sprintf("%s: %s", cg.Mode, strings.Join(cg.Controllers, " "))
	if len(missing) > 0 {
		c.Status = StatusFail
		c.Detail += "; missing " + strings.Join(missing, " ")
		if cg.Mode == "v2" {
			c.Fix = "enable them: echo '" + "+" + strings.Join(missing, " +") + "' > " + o.CgroupRoot + "/cgroup.subtree_control"
		} else {
			c.Fix = "mount the missing v1 hierarchies, e.g. mkdir " + o.CgroupRoot + "/pids && mount -t cgroup -o pids cgroup " + o.CgroupRoot + "/pids"
		}
		return []Check{c}
	}
	c.Status = StatusOK
	return []Check{c}
}

// ociPreference mirrors the oci driver's choice when no runtime is named.
var ociPreference = []string{"crun", "runc"}

var runtimePackages = map[string]string{"crun": "crun", "runc": "runc", "runsc": "runsc"}

func runtimeCheck(ctx context.Context, o HostOptions, cg Cgroups) Check {
	name := o.Runtime
	if name == "" {
		for _, n := range ociPreference {
			if _, err := o.LookPath(n); err == nil {
				name = n
				break
			}
		}
	}
	c := Check{Group: "host", Name: "runtime " + name, Essential: true}
	if name == "" {
		c.Name = "runtime"
		c.Status, c.Detail, c.Fix = StatusFail, "no OCI runtime installed", "apt-get install crun (or runc; runsc for gVisor)"
		return c
	}
	path, err := o.LookPath(name)
	if err != nil {
		c.Status, c.Detail = StatusFail, name+" not found in PATH"
		c.Fix = "apt-get install " + runtimePackages[name]
		return c
	}
	v, err := o.Version(ctx, path)
	if err != nil {
		c.Status, c.Detail, c.Fix = StatusFail, fmt.Sprintf("%s --version: %v", path, err), "reinstall "+runtimePackages[name]
		return c
	}
	c.Status, c.Detail = StatusOK, path+": "+v
	var others []string
	for _, n := range []string{"crun", "runc", "runsc"} {
		if n == name {
			continue
		}
		if _, err := o.LookPath(n); err == nil {
			others = append(others, n)
		}
	}
	if len(others) > 0 {
		c.Detail += " (also installed: " + strings.Join(others, ", ") + ")"
	}
	// crun 1.8 refuses hybrid cgroups while the unified hierarchy holds a
	// controller ("cgroups in hybrid mode not supported, drop all
	// controllers from cgroupv2").
	if name == "crun" && cg.Mode == "hybrid" && len(cg.UnifiedControllers) > 0 {
		c.Status = StatusFail
		c.Detail += "; the unified cgroup hierarchy holds " + strings.Join(cg.UnifiedControllers, " ") + ", which crun refuses in hybrid mode"
		var mounts []string
		for _, ctl := range cg.UnifiedControllers {
			mounts = append(mounts, fmt.Sprintf("mkdir -p %[1]s/%[2]s && mount -t cgroup -o %[2]s cgroup %[1]s/%[2]s", o.CgroupRoot, ctl))
		}
		c.Fix = "move those controllers to v1 hierarchies (" + strings.Join(mounts, "; ") + "), or use --runtime runc"
	}
	return c
}

func runtimeVersion(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return first, nil
}

// interpreters are the files the default languages need in the image.
var interpreters = []string{"/usr/bin/python3", "/usr/local/bin/node", "/bin/bash"}

// imageChecks checks one image directory; name is "" for the default
// image and otherwise prefixes the checks' names.
func imageChecks(o HostOptions, name, dir string) []Check {
	var checks []Check
	prefix, build := "", "build it: vertal image build --out "+dir
	if name != "" {
		prefix, build = name+": ", "build it: vertal image build --name "+name
	}
	rootfs := filepath.Join(dir, image.RootfsDir)
	rc := Check{Group: "image", Name: prefix + "root filesystem", Essential: o.Driver == "oci" && name == ""}
	if real, err := filepath.EvalSymlinks(rootfs); err == nil {
		rootfs = real // the current version of a versioned image
	}
	if _, err := os.Stat(rootfs); err != nil {
		rc.Status, rc.Detail, rc.Fix = StatusFail, err.Error(), build
		if o.Driver != "oci" {
			rc.Status = StatusWarn
		}
		return append(checks, rc)
	}
	var missing []string
	for _, p := range interpreters {
		if info, err := os.Stat(filepath.Join(rootfs, p)); err != nil || info.Mode()&0o111 == 0 {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		rc.Status, rc.Detail, rc.Fix = StatusFail, rootfs+" lacks "+strings.Join(missing, " "), "re"+build
	} else {
		rc.Status, rc.Detail = StatusOK, rootfs
	}
	checks = append(checks, rc)

	vc := Check{Group: "image", Name: prefix + "interpreter versions"}
	if v, err := image.ReadVersions(dir); err != nil {
		vc.Status, vc.Detail, vc.Fix = StatusWarn, err.Error(), "the API reports versions from it; "+build
	} else {
		vc.Status, vc.Detail = StatusOK, fmt.Sprintf("python %s, javascript %s, bash %s", v.Python, v.JavaScript, v.Bash)
		if m, err := image.ReadManifest(dir); err == nil {
			vc.Detail += fmt.Sprintf("; version %s, %d packages asked for", m.Version, len(m.Main()))
		}
	}
	checks = append(checks, vc)

	sc := Check{Group: "image", Name: prefix + "no setuid/setgid files"}
	switch found, err := image.FindSetID(rootfs); {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		sc.Status, sc.Detail = StatusWarn, err.Error()
	case len(found) > 0:
		sc.Status, sc.Detail = StatusFail, fmt.Sprintf("%d found: %s", len(found), oneLine(strings.Join(found, " "), 90))
		sc.Fix = "rebuild the image with vertal image build (it strips them); no-new-privileges already neutralises them"
	default:
		sc.Status, sc.Detail = StatusOK, "none"
	}
	return append(checks, sc)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
