package sandbox

// Overlay returns ps with the How of every protection named in how
// replaced: what a runtime (bwrap, gVisor) enforces differently from the
// driver's default. A protection that was not enforced (the host kernel
// shared under runc) is enforced by what how names, and needs no Fix.
func Overlay(ps []Protection, how map[string]string) []Protection {
	for i := range ps {
		h, ok := how[ps[i].Name]
		if !ok {
			continue
		}
		ps[i].How = h
		if !ps[i].Enforced {
			ps[i].Enforced, ps[i].Fix = true, ""
		}
	}
	return ps
}
