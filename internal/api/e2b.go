package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// The E2B-compatible API (docs/E2B.md): what E2B's own SDKs (`e2b`,
// `@e2b/code-interpreter`) send, served under /e2b so that a user sets
// E2B_API_URL and E2B_SANDBOX_URL to <base>/e2b and E2B_API_KEY to a
// Vertal key. An E2B sandbox is one of our sandboxes (same record, limits,
// quota, metering and node): these handlers only translate.
//
// There are two planes, as in E2B:
//   - the control plane (this file): REST, the API key in X-API-KEY;
//   - the data plane (e2b_envd.go, e2b_interpreter.go): envd's Connect
//     services and /files, and the code interpreter's /execute and
//     /contexts, for the sandbox named in E2b-Sandbox-Id, authenticated by
//     that sandbox's own access token in X-Access-Token.
//
// Errors answer in E2B's shape, {"code": <status>, "message": ...}, or
// as Connect errors on the Connect routes.

// e2bPrefix is where the E2B API is mounted.
const e2bPrefix = "/e2b"

// e2bEnvdVersion is the envd version the sandboxes report: the SDK turns
// features on by it (docs/E2B.md says which we serve).
const e2bEnvdVersion = "0.5.7"

// e2bClientID fills the Sandbox answer's deprecated, required clientID.
const e2bClientID = "vertal"

// e2bTokenPrefix starts every envdAccessToken we hand out.
const e2bTokenPrefix = "e2bat_"

// isE2BPath reports whether p is served by the E2B API.
func isE2BPath(p string) bool {
	return p == e2bPrefix || strings.HasPrefix(p, e2bPrefix+"/") || strings.HasPrefix(p, "/api"+e2bPrefix+"/")
}

// e2bError is E2B's error body.
type e2bError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// e2bRoutes registers the control plane under prefix (e2b_envd.go adds
// the data plane).
func (s *Server) e2bRoutes(prefix string) {
	p := prefix + e2bPrefix
	s.handle("POST "+p+"/sandboxes", s.e2bAuthed(s.e2bCreate))
	s.handle("POST "+p+"/v2/sandboxes", s.e2bAuthed(s.e2bCreate))
	s.handle("GET "+p+"/sandboxes", s.e2bAuthed(s.e2bListV1))
	s.handle("GET "+p+"/v2/sandboxes", s.e2bAuthed(s.e2bList))
	s.handle("GET "+p+"/sandboxes/{id}", s.e2bSandbox(s.e2bGet))
	s.handle("DELETE "+p+"/sandboxes/{id}", s.e2bSandbox(s.e2bKill))
	s.handle("POST "+p+"/sandboxes/{id}/timeout", s.e2bSandbox(s.e2bSetTimeout))
	s.handle("POST "+p+"/sandboxes/{id}/pause", s.e2bSandbox(s.e2bPause))
	s.handle("POST "+p+"/sandboxes/{id}/resume", s.e2bSandbox(s.e2bResume))
	s.handle("POST "+p+"/sandboxes/{id}/connect", s.e2bSandbox(s.e2bConnect))
	s.handle("POST "+p+"/v2/sandboxes/{id}/connect", s.e2bSandbox(s.e2bConnect))
	s.handle("GET "+p+"/sandboxes/{id}/metrics", s.e2bSandbox(s.e2bMetrics))
	s.handle(p+"/", s.e2bUnsupported)
	s.handle(p, s.e2bUnsupported)
	s.e2bDataRoutes(p)
}

// e2bUnsupported answers every E2B call we do not serve.
func (s *Server) e2bUnsupported(w http.ResponseWriter, r *http.Request) error {
	if r.Header.Get(e2bSandboxHeader) != "" {
		// A data-plane call (envd or the code interpreter) of a kind we
		// do not serve.
		return errorf(KindNotFound, "%s %s is not part of Vertal Run's E2B data plane (see docs/E2B.md for what is)", r.Method, clip(r.URL.Path, 80))
	}
	return errorf(KindNotFound, "%s %s is not supported by Vertal Run's E2B API (templates, volumes, secrets, snapshots and teams are not; see docs/E2B.md)", r.Method, clip(r.URL.Path, 80))
}

// e2bAuthed authenticates a control-plane call by its X-API-KEY, then
// counts it against the tenant's rate, as authed does for our own API.
func (s *Server) e2bAuthed(h authedFunc) handlerFunc {
	return s.e2bAuthedAfter(nil, h)
}

func (s *Server) e2bAuthedAfter(pre func(w http.ResponseWriter, r *http.Request, c *Caller) (bool, error), h authedFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.sbx == nil {
			return errSandboxesOff
		}
		keys := r.Header.Values("X-API-KEY")
		if len(keys) > 0 && len(r.Header.Values("Authorization")) > 0 {
			// Which one counts would depend on who reads the request.
			return errorf(KindUnauthorized, "send the API key once: in X-API-KEY or in Authorization, not both")
		}
		if len(keys) == 0 && len(r.Header.Values("Authorization")) == 1 {
			// A client of ours may send its bearer key instead.
			c, err := s.authenticate(r)
			if err != nil {
				return err
			}
			return s.serveCaller(w, r, c, pre, h)
		}
		if len(keys) != 1 || !wellFormedKey(strings.TrimSpace(keys[0])) {
			return errorf(KindUnauthorized, "missing or invalid API key: send X-API-KEY: kubo_sk_... (E2B_API_KEY)")
		}
		c, err := s.authenticateKey(r, strings.TrimSpace(keys[0]))
		if err != nil {
			return err
		}
		return s.serveCaller(w, r, c, pre, h)
	}
}

// e2bSandbox is e2bAuthed for a call about one sandbox: a malformed id is
// not found, and one held live by another node is forwarded there.
func (s *Server) e2bSandbox(h sandboxFunc) handlerFunc {
	return s.e2bAuthedAfter(s.sandboxPre, withPathID(h))
}

// e2bNewSandbox is the body of POST /v2/sandboxes (E2B's NewSandbox).
type e2bNewSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *e2bAutoResume    `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             map[string]any    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	MCP                 map[string]any    `json:"mcp"`
	IAM                 map[string]any    `json:"iam"`
	VolumeMounts        []any             `json:"volumeMounts"`
}

type e2bAutoResume struct {
	Enabled bool `json:"enabled"`
}

// e2bSandboxAnswer is E2B's Sandbox: what create, connect and resume
// answer.
type e2bSandboxAnswer struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	Alias           string `json:"alias,omitempty"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken is the same token: the code interpreter's context
	// calls send only this one.
	TrafficAccessToken string  `json:"trafficAccessToken,omitempty"`
	Domain             *string `json:"domain"`
}

// e2bDetail is E2B's SandboxDetail (get) and, without the token,
// ListedSandbox (list).
type e2bDetail struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	VolumeMounts    []any             `json:"volumeMounts"`
	Domain          *string           `json:"domain"`
	// AllowInternetAccess is false: sandboxes have no network.
	AllowInternetAccess *bool `json:"allowInternetAccess"`
}

// e2bTemplate maps an E2B template to one of our images: "base" (and
// none) is the default image; the code interpreter's templates are the
// image with the data stack where the server has it; any other name is an
// image of the operator's.
func (s *Server) e2bTemplate(c *Caller, template string) (image string) {
	switch template {
	case "", "base":
		return ""
	case "code-interpreter-v1", "code-interpreter", "code-interpreter-beta":
		if slices.Contains(s.exec.ImageNames(*c), "datasci") {
			return "datasci"
		}
		return ""
	}
	return template
}

// e2bTemplateOf is the template an image is shown as.
func e2bTemplateOf(image string) string {
	if image == "" || image == config.DefaultImage {
		return "base"
	}
	return image
}

func (s *Server) e2bCreate(w http.ResponseWriter, r *http.Request, c *Caller) error {
	var req e2bNewSandbox
	if err := s.e2bDecode(w, r, &req); err != nil {
		return err
	}
	network, err := e2bNetwork(req.AllowInternetAccess, req.Network)
	if err != nil {
		return err
	}
	switch {
	case len(req.VolumeMounts) > 0:
		return errorf(KindInvalidRequest, "volumes are not supported by Vertal Run's E2B API")
	case len(req.MCP) > 0:
		return errorf(KindInvalidRequest, "the mcp option is not supported by Vertal Run's E2B API")
	case len(req.IAM) > 0:
		return errorf(KindInvalidRequest, "the iam option is not supported by Vertal Run's E2B API")
	case req.AutoResume != nil && req.AutoResume.Enabled:
		return errorf(KindInvalidRequest, "autoResume is not supported: any call to a paused sandbox resumes it, and Sandbox.connect does too")
	}
	cr := sandboxes.CreateRequest{
		Image: s.e2bTemplate(c, req.TemplateID), Env: req.EnvVars, Metadata: req.Metadata,
		AccessToken: randomHex(e2bTokenPrefix, 24), Network: network,
	}
	if req.Timeout != nil {
		if *req.Timeout < 0 || *req.Timeout > 1<<31 {
			return errorf(KindInvalidTimeout, "timeout must be a number of seconds, at least 0")
		}
		cr.TimeoutS = int(max(*req.Timeout, 1))
		if lim := int(c.Plan.SandboxLifetime() / time.Second); cr.TimeoutS > lim {
			// E2B clamps a timeout beyond the team's maximum instead of
			// failing; so do we.
			cr.TimeoutS = lim
		}
	}
	if req.AutoPause != nil && *req.AutoPause {
		cr.OnTimeout = "pause"
	}
	sb, err := s.sbx.Create(r.Context(), *c, "", cr)
	if err != nil {
		return err
	}
	infoFrom(r.Context()).sandboxID = sb.ID
	return s.writeJSON(w, r, http.StatusCreated, e2bAnswer(sb))
}

// e2bNetwork maps E2B's network options onto a sandbox's allowlist:
// allow_internet_access false is no network; true, E2B's default that
// its Python SDK always sends, is the plan's allowlist, which is none on
// the built-in plans (Vertal Run has no open internet; the sandbox's
// allowInternetAccess then reads false); network.allowOut narrows the
// plan's, and denyOut may only be E2B's ALL_TRAFFIC ("0.0.0.0/0"), which
// is what an allowlist means anyway. Left out, the sandbox gets the
// plan's, as on /v1.
func e2bNetwork(allowInternet *bool, network map[string]any) (*sandboxes.NetworkRequest, error) {
	var out *sandboxes.NetworkRequest
	if allowInternet != nil && !*allowInternet {
		return &sandboxes.NetworkRequest{Allow: []string{}}, nil
	}
	for k, v := range network {
		switch k {
		case "allowOut":
			list, ok := v.([]any)
			if !ok {
				return nil, errorf(KindInvalidRequest, "network.allowOut must be a list of names, wildcards and CIDRs")
			}
			out = &sandboxes.NetworkRequest{Allow: []string{}}
			for _, e := range list {
				str, ok := e.(string)
				if !ok {
					return nil, errorf(KindInvalidRequest, "network.allowOut must be a list of names, wildcards and CIDRs")
				}
				out.Allow = append(out.Allow, str)
			}
		case "denyOut":
			list, ok := v.([]any)
			if !ok || len(list) > 1 || len(list) == 1 && list[0] != "0.0.0.0/0" {
				return nil, errorf(KindInvalidRequest, "network.denyOut may only be ALL_TRAFFIC (0.0.0.0/0): a sandbox reaches nothing but its allowOut list")
			}
		default:
			return nil, errorf(KindInvalidRequest, "network.%s is not supported by Vertal Run's E2B API (allowOut and denyOut are)", clip(k, 40))
		}
	}
	return out, nil
}

func e2bAnswer(sb sandboxes.Sandbox) e2bSandboxAnswer {
	return e2bSandboxAnswer{
		TemplateID: e2bTemplateOf(sb.Image), SandboxID: sb.ID, ClientID: e2bClientID,
		EnvdVersion: e2bEnvdVersion, EnvdAccessToken: sb.AccessToken, TrafficAccessToken: sb.AccessToken,
	}
}

func e2bDetailOf(sb sandboxes.Sandbox) e2bDetail {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	internet := sb.Limits.Network != nil
	return e2bDetail{
		TemplateID: e2bTemplateOf(sb.Image), SandboxID: sb.ID, ClientID: e2bClientID,
		StartedAt: sb.CreatedAt.UTC(), EndAt: sb.ExpiresAt.UTC(), EnvdVersion: e2bEnvdVersion,
		CPUCount: max(1, int(sb.Limits.CPUs+0.999)), MemoryMB: sb.Limits.MemoryMB, DiskSizeMB: sb.Limits.HomeMB,
		Metadata: md, State: string(sb.Status), VolumeMounts: []any{}, AllowInternetAccess: &internet,
	}
}

// e2bVisible gets c's sandbox id as E2B sees it: an ended one is not
// found, as a killed sandbox is on E2B.
func (s *Server) e2bVisible(ctx context.Context, c *Caller, id string) (sandboxes.Sandbox, error) {
	sb, err := s.sbx.Get(ctx, *c, id)
	if err != nil {
		return sb, err
	}
	if sb.Status == sandboxes.StatusEnded {
		return sb, errorf(KindNotFound, "sandbox %q not found: it has ended (%s)", id, sb.Reason)
	}
	return sb, nil
}

func (s *Server) e2bGet(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	sb, err := s.e2bVisible(r.Context(), c, id)
	if err != nil {
		return err
	}
	d := e2bDetailOf(sb)
	if s.e2bReachable(r.Context(), c, sb) == nil {
		d.EnvdAccessToken = sb.AccessToken
	}
	return s.writeJSON(w, r, http.StatusOK, d)
}

func (s *Server) e2bKill(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	if _, err := s.e2bVisible(r.Context(), c, id); err != nil {
		return err
	}
	if _, err := s.sbx.Kill(r.Context(), *c, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// e2bTimeoutBody is SandboxTimeoutRequest and ConnectSandbox.
type e2bTimeoutBody struct {
	Timeout *int64 `json:"timeout"`
	Memory  *bool  `json:"memory"`
}

// e2bTimeout is the timeout a body asks for, clamped to the plan's
// lifetime as E2B clamps to the team's; required says a missing one is
// an error.
func e2bTimeout(c *Caller, b e2bTimeoutBody, required bool) (time.Duration, bool, error) {
	if b.Timeout == nil {
		if required {
			return 0, false, errorf(KindInvalidTimeout, "timeout (seconds) is required")
		}
		return 0, false, nil
	}
	if *b.Timeout < 0 || *b.Timeout > 1<<31 {
		return 0, false, errorf(KindInvalidTimeout, "timeout must be a number of seconds, at least 0")
	}
	d := min(time.Duration(max(*b.Timeout, 1))*time.Second, c.Plan.SandboxLifetime())
	return d, true, nil
}

func (s *Server) e2bSetTimeout(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var b e2bTimeoutBody
	if err := s.e2bDecode(w, r, &b); err != nil {
		return err
	}
	d, _, err := e2bTimeout(c, b, true)
	if err != nil {
		return err
	}
	sb, err := s.e2bVisible(r.Context(), c, id)
	if err != nil {
		return err
	}
	if _, err := s.sbx.SetTimeout(r.Context(), *c, id, s.e2bClamp(sb, d)); err != nil {
		return e2bTimeoutErr(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// e2bTimeoutErr names E2B's field in a refused timeout.
func e2bTimeoutErr(err error) error {
	var e *Error
	if errors.As(err, &e) && e.Kind == KindInvalidTimeout {
		return errorf(KindInvalidTimeout, "%s", strings.ReplaceAll(e.Msg, "timeout_s", "timeout"))
	}
	return err
}

func (s *Server) e2bPause(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	sb, err := s.e2bVisible(r.Context(), c, id)
	if err != nil {
		return err
	}
	if sb.Status == sandboxes.StatusPaused {
		return e2bConflict("sandbox %s is already paused", id)
	}
	if _, err := s.sbx.Pause(r.Context(), *c, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// e2bConflict is a 409, which E2B's SDK reads as "already in that state".
func e2bConflict(format string, args ...any) error {
	return errorf(KindSandboxNotRunning, format, args...)
}

func (s *Server) e2bResume(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var b e2bTimeoutBody
	if err := s.e2bDecodeOptional(w, r, &b); err != nil {
		return err
	}
	sb, err := s.e2bVisible(r.Context(), c, id)
	if err != nil {
		return err
	}
	if sb.Status != sandboxes.StatusPaused {
		return e2bConflict("sandbox %s is already running", id)
	}
	if err := s.e2bReachable(r.Context(), c, sb); err != nil {
		return err
	}
	if sb, err = s.sbx.Resume(r.Context(), *c, id); err != nil {
		return err
	}
	if d, ok, err := e2bTimeout(c, b, false); err != nil {
		return err
	} else if ok {
		if extended, err := s.sbx.SetTimeout(r.Context(), *c, id, s.e2bClamp(sb, d)); err == nil {
			sb = extended
		}
	}
	return s.writeJSON(w, r, http.StatusCreated, e2bAnswer(sb))
}

// e2bConnect returns the sandbox, resuming a paused one (201) or not
// (200); the timeout only ever extends its expiry, never shortens it.
func (s *Server) e2bConnect(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	var b e2bTimeoutBody
	if err := s.e2bDecodeOptional(w, r, &b); err != nil {
		return err
	}
	d, ok, err := e2bTimeout(c, b, false)
	if err != nil {
		return err
	}
	sb, err := s.e2bVisible(r.Context(), c, id)
	if err != nil {
		return err
	}
	if err := s.e2bReachable(r.Context(), c, sb); err != nil {
		return err
	}
	status := http.StatusOK
	if sb.Status == sandboxes.StatusPaused {
		if sb, err = s.sbx.Resume(r.Context(), *c, id); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	if ok {
		// Only ever later, never sooner; past the plan's lifetime it stays
		// at the most the plan allows.
		if d = s.e2bClamp(sb, d); s.now().Add(d).After(sb.ExpiresAt) {
			if extended, err := s.sbx.SetTimeout(r.Context(), *c, id, d); err == nil {
				sb = extended
			}
		}
	}
	return s.writeJSON(w, r, status, e2bAnswer(sb))
}

// e2bMetric is E2B's SandboxMetric.
type e2bMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// e2bMetrics answers one sample for a running sandbox, from its cgroup:
// its CPU use over its live period so far, its peak memory (as memUsed)
// and its limits; no sample for a paused one.
func (s *Server) e2bMetrics(w http.ResponseWriter, r *http.Request, c *Caller, id string) error {
	sb, err := s.e2bVisible(r.Context(), c, id)
	if err != nil {
		return err
	}
	out := []e2bMetric{}
	if sb.Status == sandboxes.StatusRunning {
		now := s.now().UTC().Truncate(time.Second)
		cpus := max(1, int(sb.Limits.CPUs+0.999))
		pct := 0.0
		if sb.AliveSeconds > 0 {
			pct = min(100, 100*sb.CPUSeconds/(sb.AliveSeconds*float64(cpus)))
		}
		out = append(out, e2bMetric{
			Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpus, CPUUsedPct: pct,
			MemUsed: sb.PeakMemoryBytes, MemTotal: sb.Limits.MemoryMB << 20, DiskTotal: sb.Limits.HomeMB << 20,
		})
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

// e2bListV1 is the deprecated GET /sandboxes: running sandboxes only.
func (s *Server) e2bListV1(w http.ResponseWriter, r *http.Request, c *Caller) error {
	md, err := e2bMetadataQuery(r.URL.Query().Get("metadata"))
	if err != nil {
		return err
	}
	out := []e2bDetail{}
	cursor := ""
	for range 100 { // at most 100 pages of 100
		page, err := s.sbx.List(r.Context(), *c, sandboxes.ListRequest{Status: sandboxes.StatusRunning, Metadata: md, Limit: 100, Cursor: cursor})
		if err != nil {
			return err
		}
		for _, sb := range page.Sandboxes {
			out = append(out, e2bDetailOf(sb))
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

var e2bStates = regexp.MustCompile(`^(running|paused)(,(running|paused))*$`)

// e2bList is GET /v2/sandboxes: running and paused sandboxes, newest
// first, filtered by state and metadata, paginated by X-Next-Token.
func (s *Server) e2bList(w http.ResponseWriter, r *http.Request, c *Caller) error {
	q := r.URL.Query()
	md, err := e2bMetadataQuery(q.Get("metadata"))
	if err != nil {
		return err
	}
	want := map[sandboxes.Status]bool{sandboxes.StatusRunning: true, sandboxes.StatusPaused: true}
	if st := strings.Join(q["state"], ","); st != "" {
		if !e2bStates.MatchString(st) {
			return errorf(KindInvalidRequest, "state must be running, paused or both (comma-separated)")
		}
		want = map[sandboxes.Status]bool{}
		for _, v := range strings.Split(st, ",") {
			want[sandboxes.Status(v)] = true
		}
	}
	if o := q.Get("order"); o != "" && o != "desc" {
		return errorf(KindInvalidRequest, "order must be desc: sandboxes are listed newest first")
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		if after, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return errorf(KindInvalidRequest, "startedAfter must be an RFC 3339 time")
		}
	}
	template := q.Get("template")
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return errorf(KindInvalidRequest, "limit must be a whole number from 1 to 100")
		}
		limit = n
	}
	status := sandboxes.Status("")
	if len(want) == 1 {
		for st := range want {
			status = st
		}
	}
	cursor := q.Get("nextToken")
	out := []e2bDetail{}
	next := ""
	// Ended sandboxes are skipped here, so one page of ours may fill less
	// than a page of E2B's: read on until it is full or the list ends.
	for len(out) < limit {
		page, err := s.sbx.List(r.Context(), *c, sandboxes.ListRequest{Status: status, Metadata: md, Limit: limit - len(out), Cursor: cursor})
		if err != nil {
			return err
		}
		for _, sb := range page.Sandboxes {
			if !want[sb.Status] || (!after.IsZero() && sb.CreatedAt.Before(after)) ||
				(template != "" && e2bTemplateOf(sb.Image) != template && sb.Image != template) {
				continue
			}
			out = append(out, e2bDetailOf(sb))
		}
		if cursor = page.Next; cursor == "" {
			break
		}
		if len(out) >= limit {
			next = cursor
		}
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	return s.writeJSON(w, r, http.StatusOK, out)
}

// e2bMetadataQuery parses the metadata filter as the SDK sends it:
// "k=v&k2=v2" with each key and value URL-encoded, the pairs joined as a
// query string, and the whole URL-encoded once more as the query value
// (which url.Values has already undone): so each key and value is
// unescaped once more after the pairs are split.
func e2bMetadataQuery(v string) (map[string]string, error) {
	if v == "" {
		return nil, nil
	}
	bad := errorf(KindInvalidRequest, "metadata must be key=value pairs joined by &, each URL-encoded")
	q, err := url.ParseQuery(v)
	if err != nil {
		return nil, bad
	}
	md := map[string]string{}
	for k, vs := range q {
		if len(vs) != 1 {
			return nil, errorf(KindInvalidRequest, "metadata key %q is given more than once", clip(k, 40))
		}
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[0])
		if err1 != nil || err2 != nil {
			return nil, bad
		}
		md[key] = val
	}
	return md, nil
}

// e2bDecode strictly decodes a required small JSON body.
func (s *Server) e2bDecode(w http.ResponseWriter, r *http.Request, v any) error {
	return s.decodeBody(w, r, smallBodyBytes+e2bCreateExtra, v)
}

// e2bCreateExtra leaves room in a create's body for its metadata and
// environment (each capped by the sandboxes service).
const e2bCreateExtra = 1 << 20

// e2bDecodeOptional is e2bDecode for a body the SDK may leave out.
func (s *Server) e2bDecodeOptional(w http.ResponseWriter, r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return s.e2bDecode(w, r, v)
}

// e2bCallerOfTenant is the caller a data-plane call acts as: the tenant
// that owns the sandbox, through the key that created it. Once that key
// is revoked (or rotated away), the sandbox's token stops working: a
// leaked key's rotation then also closes what was opened with it. A
// disabled tenant is refused.
func (s *Server) e2bCallerOfTenant(ctx context.Context, tenant, keyID string) (*Caller, error) {
	k, err := s.e2bActiveKey(ctx, tenant, keyID)
	if err != nil {
		return nil, err
	}
	return s.callerOfKey(ctx, k)
}

// errE2BKeyRevoked: the key a sandbox was created with is gone.
var errE2BKeyRevoked = errorf(KindUnauthorized, "the API key that created this sandbox has been revoked or rotated, so its access token no longer works: kill the sandbox with a current key and create another (see docs/E2B.md)")

// e2bActiveKey is tenant's key keyID while it is active.
func (s *Server) e2bActiveKey(ctx context.Context, tenant, keyID string) (store.Key, error) {
	keys, err := s.store.ListKeys(ctx, tenant)
	if err != nil {
		return store.Key{}, internal(err)
	}
	for _, k := range keys {
		if k.Tenant == tenant && k.ID == keyID && k.RevokedAt.IsZero() {
			return k, nil
		}
	}
	return store.Key{}, errE2BKeyRevoked
}

// e2bReachable refuses what the E2B API cannot serve of c's sandbox sb:
// one made through /v1 (it has no access token), or one whose creating
// key was revoked (its token no longer works).
func (s *Server) e2bReachable(ctx context.Context, c *Caller, sb sandboxes.Sandbox) error {
	if sb.AccessToken == "" {
		return errorf(KindInvalidRequest, "sandbox %s was made through /v1/sandboxes and has no E2B access token: use it through /v1, or create one through the E2B API (see docs/E2B.md)", sb.ID)
	}
	if sb.KeyID != c.Key.ID {
		if _, err := s.e2bActiveKey(ctx, c.Key.Tenant, sb.KeyID); err != nil {
			return err
		}
	}
	return nil
}

// e2bClamp is d cut to what the plan's maximum lifetime leaves of sb's
// live period (E2B clamps a timeout to the team's maximum in the same
// way), and at least a second.
func (s *Server) e2bClamp(sb sandboxes.Sandbox, d time.Duration) time.Duration {
	left := sb.LiveSince.Add(time.Duration(sb.Limits.MaxLifetimeS) * time.Second).Sub(s.now())
	return max(time.Second, min(d, left.Truncate(time.Second)))
}

// writeE2BError writes e in E2B's error shape: a Connect error on the
// data plane's Connect routes, else {"code", "message"} (a sandbox that
// is not running is 502 on the data plane, as behind E2B's proxy).
func (s *Server) writeE2BError(w http.ResponseWriter, r *http.Request, e *Error) {
	if e2bConnectPath(r.URL.Path) {
		_ = e2bErrorWriter.Write(w, r, connect.NewError(e2bCode(e), errors.New(e.Msg)))
		return
	}
	status := kindStatus(e.Kind)
	if r.Header.Get(e2bSandboxHeader) != "" {
		status = e2bDataStatus(e)
	}
	if status == http.StatusTooManyRequests && strings.HasSuffix(r.URL.Path, "/execute") {
		// @e2b/code-interpreter shows no message for a 429: the rate
		// limit's refusal comes as the execution's error, as
		// e2bExecute's own refusals do.
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "name": kindCode(e.Kind), "value": e.Msg, "traceback": ""})
		return
	}
	_ = s.writeJSON(w, r, status, e2bError{Code: status, Message: e.Msg})
}

var e2bErrorWriter = connect.NewErrorWriter()
