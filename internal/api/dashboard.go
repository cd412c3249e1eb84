package api

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kuboprotocol/vertal2kubo/client/wire"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// KeyPlaceholder stands for the key in the snippets until one is created.
const KeyPlaceholder = "kubo_sk_YOUR_KEY"

type dashboardData struct {
	Name, Email, Tenant, Plan string
	Verified, Disabled        bool
	Limits                    wire.Limits
	Today                     wire.UsageToday
	QuotaHigh                 int64
	Charts                    []chart
	Keys                      []keyRow
	ActiveKeys, MaxKeys       int
	NewKey, NewKeyID          string
	KeyError                  string
	APIURL                    string
	Snippets                  []snippet
}

type keyRow struct{ ID, Created, LastUsed string }

type snippet struct{ ID, Title, Text string }

// chart is a 30-day bar chart drawn as SVG by the template.
type chart struct {
	Title, Class, Max, First, Last string
	W, H, Base                     int
	Bars                           []bar
}

type bar struct {
	X, Y, Width, Height float64
	Label               string
}

const chartDays = 30

func newChart(title, class string, days []string, values []float64, unit string) chart {
	const w, h, base = 600, 130, 112
	c := chart{Title: title, Class: class, W: w, H: h, Base: base, First: days[0][5:], Last: days[len(days)-1][5:]}
	top := slices.Max(values)
	c.Max = fmt.Sprintf("%.4g%s", top, unit)
	slot := float64(w) / float64(len(values))
	for i, v := range values {
		height := 0.0
		if top > 0 {
			height = v / top * (base - 4)
		}
		c.Bars = append(c.Bars, bar{X: float64(i)*slot + 1, Y: base - height, Width: slot - 2, Height: height,
			Label: fmt.Sprintf("%s: %.4g%s", days[i], v, unit)})
	}
	return c
}

// dashboard shows the account's plan, usage, keys and snippets. newKey is
// set when the page answers the no-script form that created one.
func (s *Server) dashboardData(r *http.Request, se *session, newKey string, k store.Key) (dashboardData, error) {
	ctx := r.Context()
	t, err := s.store.Tenant(ctx, se.account.Tenant)
	if err != nil {
		return dashboardData{}, internal(err)
	}
	plan := s.plans[t.Plan]
	now := s.now().UTC()
	d := dashboardData{Name: se.account.Name, Email: se.account.Email, Tenant: t.ID, Plan: t.Plan,
		Verified: !se.account.VerifiedAt.IsZero(), Disabled: t.Disabled, MaxKeys: store.MaxActiveKeys, NewKey: newKey, NewKeyID: k.ID,
		Limits: wire.Limits{ExecutionsPerDay: plan.ExecutionsPerDay, RequestsPerMinute: plan.RequestsPerMinute,
			MaxTimeoutS: plan.MaxTimeoutS, MemoryMB: plan.MemoryMB},
		QuotaHigh: plan.ExecutionsPerDay * 9 / 10}
	if d.Name == "" {
		d.Name = se.account.Email
	}
	days := make([]string, chartDays)
	execs, secs := make([]float64, chartDays), make([]float64, chartDays)
	for i := range chartDays {
		day := now.AddDate(0, 0, i-chartDays+1).Format(time.DateOnly)
		u, err := s.store.Usage(ctx, t.ID, day)
		if err != nil {
			return dashboardData{}, internal(err)
		}
		days[i], execs[i], secs[i] = day, float64(u.Executions), u.SandboxSeconds
		if i == chartDays-1 {
			d.Today = wire.UsageToday{Date: day, Executions: u.Executions, SandboxSeconds: round3(u.SandboxSeconds), CPUSeconds: round3(u.CPUSeconds)}
		}
	}
	d.Charts = []chart{newChart("Executions", "chart-exec", days, execs, ""), newChart("Sandbox seconds", "chart-secs", days, secs, " s")}
	keys, err := s.store.ListKeys(ctx, t.ID)
	if err != nil {
		return dashboardData{}, internal(err)
	}
	for _, k := range keys {
		if !k.RevokedAt.IsZero() {
			continue
		}
		row := keyRow{ID: k.ID, Created: k.CreatedAt.Format(time.DateTime), LastUsed: "never"}
		if !k.LastUsedAt.IsZero() {
			row.LastUsed = k.LastUsedAt.Format("2006-01-02 15:04")
		}
		d.Keys = append(d.Keys, row)
	}
	d.ActiveKeys = len(d.Keys)
	d.APIURL = s.publicBase(r) + "/api"
	key := newKey
	if key == "" {
		key = KeyPlaceholder
	}
	d.Snippets = snippets(d.APIURL, key)
	return d, nil
}

// snippets are ready to paste, for this server and key.
func snippets(apiURL, key string) []snippet {
	return []snippet{
		{"curl", "curl", "curl -sS -X POST " + apiURL + "/v1/executions \\\n" +
			"  -H \"Authorization: Bearer " + key + "\" \\\n" +
			"  -H \"Content-Type: application/json\" \\\n" +
			"  -d '{\"language\": \"python\", \"code\": \"print(6 * 7)\"}'"},
		{"python", "Python SDK", "from vertal2kubo.client import KuboClient\n\n" +
			"client = KuboClient(\"" + apiURL + "\", \"" + key + "\")\n" +
			"print(client.run(\"print(6 * 7)\", language=\"python\")[\"stdout\"])"},
		{"go", "Go SDK", "c, err := client.New(\"" + apiURL + "\", \"" + key + "\")\n" +
			"if err != nil {\n\tlog.Fatal(err)\n}\n" +
			"ex, err := c.Run(ctx, \"print(6 * 7)\", client.WithLanguage(\"python\"))\n" +
			"if err != nil {\n\tlog.Fatal(err)\n}\nfmt.Print(ex.Stdout)"},
		{"claude-desktop", "Claude Desktop (claude_desktop_config.json)", "{\n  \"mcpServers\": {\n    \"vertal-run\": {\n" +
			"      \"command\": \"vertal\",\n      \"args\": [\"mcp\"],\n" +
			"      \"env\": {\"KUBO_API_URL\": \"" + apiURL + "\", \"KUBO_API_KEY\": \"" + key + "\"}\n    }\n  }\n}"},
		{"claude-stdio", "Claude Code, stdio", "claude mcp add vertal-run --env KUBO_API_URL=" + apiURL +
			" --env KUBO_API_KEY=" + key + " -- vertal mcp"},
		{"claude-http", "Claude Code, HTTP", "claude mcp add --transport http vertal-run " + apiURL +
			"/mcp --header \"Authorization: Bearer " + key + "\""},
	}
}

func (s *Server) dashboard(w http.ResponseWriter, r *http.Request, se *session) error {
	d, err := s.dashboardData(r, se, "", store.Key{})
	if err != nil {
		return err
	}
	// A disabled tenant's session is refused like its keys; the page says
	// why, and the account can still sign out.
	if d.Disabled {
		return s.render(w, r, http.StatusForbidden, "message.html", se, Page{Title: "Account disabled", Error: errTenantDisabled.Msg})
	}
	return s.render(w, r, http.StatusOK, "dashboard.html", se, Page{Title: "Dashboard", Section: "dashboard", Data: d})
}

type newKeyResponse struct {
	APIKey  string `json:"api_key"`
	KeyID   string `json:"key_id"`
	Created string `json:"created"`
}

// createDashboardKey makes a key for the account's tenant. The dashboard's
// script asks for JSON; the form without script gets the page with the
// key in it (not cached, and never shown again).
func (s *Server) createDashboardKey(w http.ResponseWriter, r *http.Request, se *session) error {
	wantJSON := strings.Contains(r.Header.Get("Accept"), "application/json")
	fail := func(e *Error) error {
		if wantJSON {
			return e
		}
		d, err := s.dashboardData(r, se, "", store.Key{})
		if err != nil {
			return err
		}
		d.KeyError = e.Msg
		return s.render(w, r, kindStatus(e.Kind), "dashboard.html", se, Page{Title: "Dashboard", Section: "dashboard", Data: d})
	}
	if se.account.VerifiedAt.IsZero() {
		return fail(errorf(KindForbidden, "verify your email before creating keys"))
	}
	t, err := s.store.Tenant(r.Context(), se.account.Tenant)
	if err != nil {
		return internal(err)
	}
	if t.Disabled {
		return fail(errTenantDisabled)
	}
	// Plan "" : a key never writes its tenant's plan.
	secret, k, err := CreateKey(r.Context(), s.store, t.ID, "", s.now())
	if errors.Is(err, store.ErrTooManyKeys) {
		return fail(errorf(KindTooManyKeys, "you already have %d active keys, the most an account may hold; revoke one first", store.MaxActiveKeys))
	}
	if err != nil {
		return internal(err)
	}
	infoFrom(r.Context()).keyID = k.ID
	if wantJSON {
		return s.writeJSON(w, r, http.StatusCreated, newKeyResponse{APIKey: secret, KeyID: k.ID, Created: k.CreatedAt.Format(time.DateTime)})
	}
	d, err := s.dashboardData(r, se, secret, k)
	if err != nil {
		return err
	}
	return s.render(w, r, http.StatusCreated, "dashboard.html", se, Page{Title: "Dashboard", Section: "dashboard", Data: d})
}

// ownKey finds an active key of the account's tenant.
func (s *Server) ownKey(r *http.Request, se *session) (string, error) {
	id := r.PathValue("id")
	keys, err := s.store.ListKeys(r.Context(), se.account.Tenant)
	if err != nil {
		return "", internal(err)
	}
	for _, k := range keys {
		if k.ID == id && k.RevokedAt.IsZero() {
			return id, nil
		}
	}
	return "", errorf(KindNotFound, "no active key %s in this account", id)
}

func (s *Server) revokePage(w http.ResponseWriter, r *http.Request, se *session) error {
	id, err := s.ownKey(r, se)
	if err != nil {
		return err
	}
	return s.render(w, r, http.StatusOK, "revoke.html", se, Page{Title: "Revoke " + id, Section: "dashboard", Data: id})
}

func (s *Server) revokeDashboardKey(w http.ResponseWriter, r *http.Request, se *session) error {
	id, err := s.ownKey(r, se)
	if err != nil {
		return err
	}
	if err := s.store.RevokeKey(r.Context(), id, s.now()); err != nil && !errors.Is(err, store.ErrNotFound) {
		return internal(err)
	}
	http.Redirect(w, r, "/dashboard", http.StatusSeeOther)
	return nil
}

type tenantRow struct {
	ID, Email, Plan   string
	Disabled          bool
	Executions, Quota int64
	ActiveKeys        int
}

// operator wraps the operator pages: a signed-in account with role
// operator; anyone else gets 404, as if the pages did not exist.
func (s *Server) operator(h pageHandler) handlerFunc {
	return s.signedIn(func(w http.ResponseWriter, r *http.Request, se *session) error {
		if se.account.Role != store.RoleOperator {
			return errorf(KindNotFound, "no such page")
		}
		return h(w, r, se)
	})
}

func (s *Server) operatorPage(w http.ResponseWriter, r *http.Request, se *session) error {
	ctx := r.Context()
	tenants, err := s.store.Tenants(ctx)
	if err != nil {
		return internal(err)
	}
	accounts, err := s.store.ListAccounts(ctx)
	if err != nil {
		return internal(err)
	}
	keys, err := s.store.ListKeys(ctx, "")
	if err != nil {
		return internal(err)
	}
	owner := map[string]string{}
	for _, a := range accounts {
		owner[a.Tenant] = a.Email
	}
	active := map[string]int{}
	for _, k := range keys {
		if k.RevokedAt.IsZero() {
			active[k.Tenant]++
		}
	}
	day := s.now().UTC().Format(time.DateOnly)
	rows := make([]tenantRow, 0, len(tenants))
	for _, t := range tenants {
		u, err := s.store.Usage(ctx, t.ID, day)
		if err != nil {
			return internal(err)
		}
		rows = append(rows, tenantRow{ID: t.ID, Email: owner[t.ID], Plan: t.Plan, Disabled: t.Disabled,
			Executions: u.Executions, Quota: s.plans[t.Plan].ExecutionsPerDay, ActiveKeys: active[t.ID]})
	}
	data := struct {
		Tenants []tenantRow
		Plans   []string
	}{rows, config.PlanNames(s.plans)}
	return s.render(w, r, http.StatusOK, "operator.html", se, Page{Title: "Tenants", Section: "operator", Data: data,
		Notice: noticeParam(r)})
}

func (s *Server) operatorSetPlan(w http.ResponseWriter, r *http.Request, se *session) error {
	plan := r.PostFormValue("plan")
	if _, ok := s.plans[plan]; !ok {
		return errorf(KindInvalidRequest, "unknown plan %q", plan)
	}
	if err := s.store.SetPlan(r.Context(), r.PathValue("id"), plan); errors.Is(err, store.ErrNotFound) {
		return errorf(KindNotFound, "no tenant %s", r.PathValue("id"))
	} else if err != nil {
		return internal(err)
	}
	http.Redirect(w, r, "/operator", http.StatusSeeOther)
	return nil
}

func (s *Server) operatorDisable(disabled bool) pageHandler {
	return func(w http.ResponseWriter, r *http.Request, se *session) error {
		if err := s.store.SetTenantDisabled(r.Context(), r.PathValue("id"), disabled); errors.Is(err, store.ErrNotFound) {
			return errorf(KindNotFound, "no tenant %s", r.PathValue("id"))
		} else if err != nil {
			return internal(err)
		}
		http.Redirect(w, r, "/operator", http.StatusSeeOther)
		return nil
	}
}
