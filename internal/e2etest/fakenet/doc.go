// Package fakenet builds a small fake internet for the end-to-end tests of
// per-sandbox egress allowlists: two network namespaces joined by a veth
// pair and nothing else. ServerNS is where the server under test runs;
// InetNS holds in-process HTTP, HTTPS and UDP servers on 203.0.113.10
// (and 2001:db8::10 where IPv6 works). Neither namespace has a default
// route or a link to the host's network, so test traffic reaches loopback
// or these servers and nothing else; a name outside the fake zone fails
// fast (its resolver points at 127.0.0.1, where nothing listens).
//
// Every entry point needs root, ip (iproute2) and nsenter and unshare
// (util-linux); Start gates on VERTAL_E2E=1 like the rest of package
// e2etest.
//
// A test of a server binary with an egress allowlist:
//
//	n := fakenet.Start(t)
//	cmd := n.CommandContext(ctx, serverBin, "--listen", "127.0.0.1:8080")
//	if err := cmd.Start(); err != nil { ... }   // runs in n.ServerNS
//	api := &http.Client{Transport: &http.Transport{DialContext: n.DialContext}}
//	api.Get("http://127.0.0.1:8080/...")         // ServerNS's loopback
//	// ...sandboxed code fetches https://allowed.test/ and https://other.test/...
//	n.Requests()                                  // what reached the fake internet
package fakenet
