package client

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kuboprotocol/vertal2kubo/client/wire"
)

// TestNetworkRequestBodies holds the network of a run, a submit and a
// batch item to a golden file: left out without WithNetwork (the plan's
// allowlist), "allow": [] for WithNetwork() (none).
func TestNetworkRequestBodies(t *testing.T) {
	run := func(opts ...RunOption) wire.ExecutionRequest { return newRunRequest("print(1)", opts).ExecutionRequest }
	c, _ := newTestClient(t, "http://127.0.0.1:1")
	submit, err := c.runCallAsync("print(1)", []RunOption{WithNetwork("pypi.org")}, true)
	if err != nil {
		t.Fatal(err)
	}
	batch := newBatchRequest([]BatchItem{
		{Code: "plan"},
		{Code: "none", Network: &wire.NetworkRequest{}},
		{Code: "narrowed", Network: &wire.NetworkRequest{Allow: []string{"pypi.org", "203.0.113.0/24"}}},
	}, nil)
	checkGolden(t, "testdata/run_request_network.json", map[string]any{
		"run_plan":     run(),
		"run_allow":    run(WithNetwork("pypi.org", "*.pythonhosted.org")),
		"run_repeated": run(WithNetwork("pypi.org"), WithNetwork("203.0.113.0/24")),
		"run_none":     run(WithNetwork()),
		"submit":       json.RawMessage(submit.body),
		"batch":        batch.BatchRequest,
	})
}

// An execution's network record and its usage bytes come through Run as
// the API sent them, and are absent (nil) for one without a network.
func TestRunDecodesNetwork(t *testing.T) {
	const withNetwork = `{"id":"exe_n","status":"failed","stdout":"","stderr":"URLError\n","exit_code":1,"duration_ms":812,"truncated":false,` +
		`"usage":{"sandbox_seconds":0.812,"cpu_seconds":0.2,"peak_memory_bytes":0,"network_bytes_in":5120,"network_bytes_out":312},"request_id":"req_n",` +
		`"network":{"allow":["pypi.org"],"bytes_in":5120,"bytes_out":312,"connections":1,"refused":1,"attempts":[` +
		`{"host":"pypi.org","port":443,"kind":"tls","allowed":true,"addr":"151.101.0.223:443","bytes_out":312,"bytes_in":5120},` +
		`{"host":"example.com","port":443,"kind":"tls","allowed":false,"reason":"example.com is not in the allowlist","bytes_out":0,"bytes_in":0}]}}`
	f, srv := newFakeAPI(t)
	f.push("POST /v1/executions", reply{status: 200, body: withNetwork})
	c, _ := newTestClient(t, srv.URL)
	ex, err := c.Run(t.Context(), "import urllib.request", WithNetwork("pypi.org"))
	if err != nil {
		t.Fatal(err)
	}
	in, out := int64(5120), int64(312)
	wantUsage := ExecutionUsage{SandboxSeconds: 0.812, CPUSeconds: 0.2, NetworkBytesIn: &in, NetworkBytesOut: &out}
	wantNetwork := &wire.ExecutionNetwork{Allow: []string{"pypi.org"}, BytesIn: 5120, BytesOut: 312, Connections: 1, Refused: 1,
		Attempts: []wire.NetworkAttempt{
			{Host: "pypi.org", Port: 443, Kind: "tls", Allowed: true, Addr: "151.101.0.223:443", BytesOut: 312, BytesIn: 5120},
			{Host: "example.com", Port: 443, Kind: "tls", Reason: "example.com is not in the allowlist"},
		}}
	if diff := cmp.Diff(wantUsage, ex.Usage); diff != "" {
		t.Errorf("Usage (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantNetwork, ex.Network); diff != "" {
		t.Errorf("Network (-want +got):\n%s", diff)
	}
	if got := f.requests()[0].Body; got != `{"language":"python","code":"import urllib.request","network":{"allow":["pypi.org"]}}` {
		t.Errorf("request body %s", got)
	}

	// One made by hand is written in the wire's shape, network included.
	ex.Raw = nil
	b, err := json.Marshal(ex)
	if err != nil {
		t.Fatal(err)
	}
	var back Execution
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantNetwork, back.Network); diff != "" {
		t.Errorf("Network after MarshalJSON (-want +got):\n%s", diff)
	}

	got, err := c.Run(t.Context(), "print(6 * 7)")
	if err != nil {
		t.Fatal(err)
	}
	if got.Network != nil || got.Usage.NetworkBytesIn != nil || got.Usage.NetworkBytesOut != nil {
		t.Errorf("an execution without a network has Network %+v, usage %+v", got.Network, got.Usage)
	}
}
