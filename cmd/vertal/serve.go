package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/kuboprotocol/vertal2kubo/client"
	"github.com/kuboprotocol/vertal2kubo/internal/account"
	"github.com/kuboprotocol/vertal2kubo/internal/api"
	"github.com/kuboprotocol/vertal2kubo/internal/config"
	"github.com/kuboprotocol/vertal2kubo/internal/egress"
	"github.com/kuboprotocol/vertal2kubo/internal/engine"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/docker"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/oci"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/pool"
	"github.com/kuboprotocol/vertal2kubo/internal/engine/sandbox/uidpool"
	"github.com/kuboprotocol/vertal2kubo/internal/execution"
	"github.com/kuboprotocol/vertal2kubo/internal/image"
	"github.com/kuboprotocol/vertal2kubo/internal/lang"
	"github.com/kuboprotocol/vertal2kubo/internal/mcpserver"
	"github.com/kuboprotocol/vertal2kubo/internal/queue"
	"github.com/kuboprotocol/vertal2kubo/internal/sandboxes"
	"github.com/kuboprotocol/vertal2kubo/internal/store"
	"github.com/kuboprotocol/vertal2kubo/internal/store/postgres"
	"github.com/kuboprotocol/vertal2kubo/internal/store/sqlite"
	"github.com/kuboprotocol/vertal2kubo/internal/web"
	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// devTenant is the tenant `serve --dev` creates.
const devTenant = "local"

func cmdServe(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "serve", "serve [flags]\n\nStarts the API. Every flag can also be set with the VERTAL_* variable shown, or in the --config file.")
	b := config.Bind(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg, err := b.Resolve(e.Getenv)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewJSONHandler(e.Stderr, nil))
	return serve(ctx, e, cfg, logger)
}

// serve runs the server until ctx ends: the configuration's images, the
// store, the engine, the execution service that every entry point shares
// (the API, the MCP tools, the queue's workers), then the servers.
func serve(ctx context.Context, e *env, cfg config.Config, logger *slog.Logger) error {
	images, err := offeredImages(ctx, cfg, logger)
	if err != nil {
		return err
	}
	st, storeDesc, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	metrics := api.NewMetrics()
	eng, driver, closeEngine, err := newEngine(ctx, cfg, images[0].Languages, metrics, logger)
	if err != nil {
		return err
	}
	defer closeEngine()
	driverName := driver.Name()

	nodeID := cfg.Node()
	q, err := newQueue(ctx, cfg, st, nodeID, logger)
	if err != nil {
		return err
	}
	eg, err := newEgress(cfg, nodeID)
	if err != nil {
		return err
	}
	if eg != nil {
		metrics.Add(eg)
	}
	sbx, err := newSandboxes(cfg, st, driver, eng, images, nodeID, eg, logger)
	if err != nil {
		return err
	}
	var nodeStopped func(context.Context, string)
	if sbx != nil {
		nodeStopped = sbx.EndNodeSandboxes
		metrics.Add(sbx)
	}
	// The API's socket is bound first, so the address other nodes forward
	// this node's sandbox calls to is known (config.AdvertiseFor) before
	// the first heartbeat carries it; it is served once all is built.
	ln, err := net.Listen("tcp", cfg.Addr())
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Addr(), err)
	}
	defer ln.Close()
	svc, err := newService(cfg, st, eng, images, nodeID, q, metrics, nodeStopped, cfg.AdvertiseFor(ln.Addr()), eg, logger)
	if err != nil {
		return err
	}
	accounts, err := newAccounts(cfg, st, logger)
	if err != nil {
		return err
	}
	srv, err := newAPI(cfg, st, svc, sbx, accounts, images, nodeID, metrics, logger)
	if err != nil {
		return err
	}

	// Settle what an earlier run of this node left unfinished, then keep
	// sending heartbeats; the queue's workers start after that.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	if err := svc.Start(bgCtx); err != nil {
		return err
	}
	if sbx != nil {
		if err := sbx.Start(bgCtx); err != nil {
			return err
		}
	}
	if err := q.Start(bgCtx, queue.Handlers{Run: svc.RunQueued, Deliver: svc.DeliverWebhook}); err != nil {
		return fmt.Errorf("starting the queue: %w", err)
	}
	go accounts.PurgeEvery(bgCtx, account.PurgeInterval)

	ls, err := listen(cfg, ln, srv, metrics, logger)
	if err != nil {
		return err
	}
	// `vertal status` reads the settings in effect from a socket in the
	// data directory.
	defer serveOperatorSocket(cfg.DataDir, newServerSettings(cfg, driverName, nodeID, cfg.Workers()), logger)()
	base := "http://" + ls.addr.String()
	announce(e, cfg, base, driverName, storeDesc)
	if cfg.Dev {
		if err := devKey(ctx, e, st, base, createKeyHint(cfg, devTenant)); err != nil {
			ls.close()
			return err
		}
	}
	logger.Info("serving", "addr", ls.addr.String(), "driver", driverName, "store", storeDesc,
		"max_concurrent", cfg.MaxConcurrent, "queue_timeout", cfg.QueueTimeout.D().String(), "edge_secret", cfg.EdgeSecret != "",
		"max_conns", cfg.MaxConns, "max_conns_per_ip", cfg.MaxConnsPerIP, "idle_timeout", cfg.IdleTimeout.D().String())

	select {
	case err := <-ls.errc:
		ls.close()
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	// Finish what is running: an execution in progress is paid for and its
	// result is stored, so let it end before closing the store.
	logger.Info("shutting down; waiting for running requests")
	sctx, cancel := context.WithTimeout(context.Background(), longestRequest(cfg)+30*time.Second)
	defer cancel()
	ls.shutdown(sctx, logger)
	// Sandboxes that stay are paused, so an upgrade loses none of their
	// files; the next call resumes them (docs/SANDBOXES.md).
	if sbx != nil {
		if err := sbx.Shutdown(sctx); err != nil {
			logger.Warn("pausing sandboxes", "error", err)
		}
	}
	// The queue's running jobs finish too; those not started stay queued
	// for the next node.
	if err := q.Stop(sctx); err != nil {
		logger.Warn("stopping the queue", "error", err)
	}
	stopBackground()
	logger.Info("stopped")
	return nil
}

// announce tells the operator where the server listens, and on what.
func announce(e *env, cfg config.Config, base, driverName, storeDesc string) {
	fmt.Fprintf(e.Stdout, "Vertal Run %s listening on %s\n", version, base)
	warm := "warm pool off"
	if cfg.PoolMax > 0 {
		warm = fmt.Sprintf("warm pool %d..%d per language", cfg.PoolMin, cfg.PoolMax)
	}
	fmt.Fprintf(e.Stdout, "  sandboxes: %s, %d at once, %s; store: %s\n", driverName, cfg.MaxConcurrent, warm, storeDesc)
	fmt.Fprintf(e.Stdout, "  playground: %s/   API: %s/api/v1 (also %s/v1)   OpenAPI: %s/v1/openapi.json\n", base, base, base, base)
}

// offeredImages resolves the configured images (the default one first),
// says which are not offered and why, and on the oci driver deletes their
// replaced versions in the background until ctx ends.
func offeredImages(ctx context.Context, cfg config.Config, logger *slog.Logger) ([]config.Image, error) {
	images, skipped, err := cfg.ResolveImages()
	if err != nil {
		return nil, err
	}
	for name, err := range skipped {
		logger.Warn("image not offered", "image", name, "error", err)
	}
	if cfg.Driver == "oci" {
		go collectImageVersions(ctx, images, logger)
	}
	for _, l := range images[0].Languages {
		if l.Version == "" {
			logger.Warn("language version unknown; /v1/languages reports null", "language", l.Name,
				"versions_file", filepath.Join(cfg.ImageDir, config.VersionsFile))
		}
	}
	return images, nil
}

// newEngine builds the configured driver, removes what an earlier run
// left, puts the warm pool of langs in front of it if configured, and
// returns the engine over them, with the driver's name and a func that
// closes them. metrics gets the pool's series and the engine's slots.
func newEngine(ctx context.Context, cfg config.Config, langs []engine.Language, metrics *api.Metrics, logger *slog.Logger) (*engine.Engine, engine.Driver, func(), error) {
	driver, pre, closeDriver, err := newDriver(ctx, cfg, cfg.StateDir, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	if n, err := driver.Reap(ctx); err != nil {
		logger.Warn("removing sandboxes left by an earlier run", "error", err)
	} else if n > 0 {
		logger.Info("removed sandboxes left by an earlier run", "count", n)
	}
	// With their sandboxes gone, the uid leases a crashed server held
	// return to the host-wide pool.
	if n, err := reapUIDLeases(); err != nil {
		logger.Warn("releasing uid leases left by an earlier run", "error", err)
	} else if n > 0 {
		logger.Info("released uid leases left by an earlier run", "count", n)
	}
	// What sandbox uids left in the host's temporary directories may take
	// long to sweep: it runs while the server starts and serves, and stops
	// before the driver closes.
	if sw, ok := driver.(interface{ SweepHostFiles(context.Context) }); ok {
		sctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); sw.SweepHostFiles(sctx) }()
		next := closeDriver
		closeDriver = func() { stop(); <-done; next() }
	}
	runner, closeAll := driver, closeDriver
	if cfg.PoolMax > 0 {
		p := pool.New(driver, pre, pool.Options{
			Min:         cfg.PoolMin,
			Max:         cfg.PoolMax,
			MemoryBytes: int64(cfg.PoolMemoryMB) << 20,
			Languages:   langs,
			Limits:      cfg.Plans[cfg.PoolPlan].Limits(0),
			Logger:      logger,
		})
		// Warm sandboxes are destroyed while the driver can still do it.
		closeAll = func() { p.Close(); closeDriver() }
		metrics.Add(p)
		runner = p
	}
	eng, err := engine.New(runner, engine.Options{MaxConcurrent: cfg.MaxConcurrent, QueueTimeout: cfg.QueueTimeout.D(), MaxQueue: cfg.QueueSize()})
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	metrics.SetEngine(eng)
	return eng, driver, closeAll, nil
}

// newQueue opens the durable queue that async executions and webhook
// deliveries go through, on the store's own database. Its workers start
// with the service's handlers (Queue.Start).
func newQueue(ctx context.Context, cfg config.Config, st store.Store, nodeID string, logger *slog.Logger) (*queue.Queue, error) {
	o := queue.Options{Workers: cfg.Workers(), NodeID: nodeID, RescueAfter: cfg.RescueAfter(), RetryBase: cfg.WebhookRetryBase.D(), Logger: logger}
	switch db := st.(type) {
	case interface{ WriterDB() *sql.DB }:
		return queue.OpenSQLite(ctx, db.WriterDB(), o)
	case interface{ Pool() *pgxpool.Pool }:
		return queue.OpenPostgres(ctx, db.Pool(), o)
	}
	return nil, fmt.Errorf("the store %T has no database for the queue", st)
}

// newService builds the one execution service: it runs what the API, the
// MCP tools and the queue's workers ask for, and renders, counts and logs
// as the API does.
// nodeStopped, if set, hears of each stopped node found (execution.Options).
// eg, if set, gives executions on plans with egress their network,
// through the agent binary (findAgent), which must then be there.
func newService(cfg config.Config, st store.Store, eng *engine.Engine, images []config.Image, nodeID string, q *queue.Queue, metrics *api.Metrics,
	nodeStopped func(context.Context, string), nodeAddress string, eg *egress.Host, logger *slog.Logger) (*execution.Service, error) {
	allow, _ := cfg.WebhookAllow() // validated with the configuration
	guard := webhook.NewGuard(allow, webhook.InterfaceNetworks)
	var agent string
	if eg != nil {
		// A plan with egress and no agent would refuse every request of
		// its tenants that leaves network out: better not to start.
		var err error
		if agent, err = findAgent(cfg); err != nil {
			return nil, fmt.Errorf("a plan allows egress, which needs the agent binary: %w", err)
		}
	}
	return execution.New(execution.Options{
		Store:         st,
		Engine:        eng,
		Languages:     images[0].Languages,
		Images:        images,
		Plans:         cfg.Plans,
		MaxCodeBytes:  cfg.MaxCodeBytes,
		MaxStdinBytes: cfg.MaxStdinBytes,
		QueueTimeout:  cfg.QueueTimeout.D(),
		NodeID:        nodeID,
		Queue:         q,
		Webhooks:      &execution.Webhooks{Guard: guard, Client: webhook.NewClient(webhook.Options{Guard: guard}), RetryFor: cfg.WebhookRetryFor.D()},
		Render:        api.RenderExecution,
		NodeTimeout:   cfg.NodeTimeout.D(),
		NodeStopped:   nodeStopped,
		NodeAddress:   nodeAddress,
		Egress:        eg,
		Agent:         agent,
		Metrics:       metrics,
		Logger:        logger,
	})
}

// newAccounts is the account service behind the sign-up and dashboard
// pages, mailing through cfg.SMTPURL if set.
func newAccounts(cfg config.Config, st store.Store, logger *slog.Logger) (*account.Service, error) {
	var mailer account.Mailer
	if cfg.SMTPURL != "" {
		m, err := account.ParseSMTPURL(cfg.SMTPURL)
		if err != nil {
			return nil, err
		}
		mailer = m
	}
	return account.New(account.Options{Store: st, Signup: cfg.Signup, Mailer: mailer, PublicURL: cfg.PublicURL, Logger: logger})
}

// newAPI is the HTTP API over svc, with the MCP server (its tools call
// svc too), the web pages and the account pages mounted.
func newAPI(cfg config.Config, st store.Store, svc *execution.Service, sbx *sandboxes.Service, accounts *account.Service, images []config.Image, nodeID string, metrics *api.Metrics, logger *slog.Logger) (*api.Server, error) {
	mcpHandler := mcpserver.HTTPHandler(mcpserver.HTTPOptions{
		Options: mcpserver.Options{Version: version, Logger: logger, Languages: clientLanguages(images[0].Languages), Images: clientImages(images)},
		Backend: mcpBackend(svc, sbx, metrics, logger),
	})
	doc, err := api.OpenAPIDocument(version, "/api")
	if err != nil {
		return nil, err
	}
	return api.New(api.Options{
		Service:    svc,
		Sandboxes:  sbx,
		Store:      st,
		Accounts:   accounts,
		Pages:      web.NewPages(web.Options{OpenAPI: doc, Version: version, APIBase: "/api", Logger: logger}),
		PublicURL:  cfg.PublicURL,
		Version:    version,
		NodeID:     nodeID,
		EdgeSecret: cfg.EdgeSecret,
		Web:        web.Handler(web.Options{OpenAPI: doc, Version: version, APIBase: "/api", Logger: logger, Accounts: true}),
		MCP:        mcpHandler,
		Metrics:    metrics,
		Logger:     logger,
	})
}

// mcpBackend is the /mcp tools' backend: run_code always, the sandbox
// tools when the server has sandboxes that stay (a nil service must not
// become a non-nil interface, which would list them).
func mcpBackend(svc *execution.Service, sbx *sandboxes.Service, metrics *api.Metrics, logger *slog.Logger) func(*http.Request) (mcpserver.Backend, error) {
	if sbx == nil {
		return api.MCPBackend(svc, metrics, logger)
	}
	return api.MCPBackendWithSandboxes(svc, sbx, metrics, logger)
}

// listening is the API's server and, if configured, the metrics server,
// serving; errc gets the first error that stops one.
type listening struct {
	addr    net.Addr // the API's
	servers []*http.Server
	errc    chan error
}

// listen serves h on ln (bound to cfg.Addr()) and the metrics on
// cfg.MetricsAddr.
func listen(cfg config.Config, ln net.Listener, h http.Handler, metrics *api.Metrics, logger *slog.Logger) (*listening, error) {
	// Connections cost a file descriptor each and need no key until a
	// request on them passes the key check; cap them in total and per
	// client address, and those not yet authenticated per prefix too.
	proxies, err := cfg.Proxies()
	if err != nil {
		return nil, err
	}
	conns := api.NewConnLimiter(api.ConnLimits{Max: cfg.MaxConns, PerAddr: cfg.MaxConnsPerIP, PerTenant: cfg.TenantConns(), MaxUnauth: cfg.UnauthConns(),
		UnauthPerPrefix: cfg.MaxUnauthConnsPerPrefix, Proxies: proxies, Logger: logger, Metrics: metrics})
	ln = conns.Listener(ln)
	httpSrv := newHTTPServer(cfg, conns.Handler(h), logger)
	httpSrv.ConnContext = conns.ConnContext
	ls := &listening{addr: ln.Addr(), servers: []*http.Server{httpSrv}, errc: make(chan error, 2)}
	go func() { ls.errc <- httpSrv.Serve(ln) }()

	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			ls.close()
			return nil, fmt.Errorf("listening for metrics on %s: %w", cfg.MetricsAddr, err)
		}
		msrv := &http.Server{Handler: metrics.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: httpSrv.ErrorLog}
		ls.servers = append(ls.servers, msrv)
		go func() { ls.errc <- msrv.Serve(mln) }()
		logger.Info("metrics listening", "addr", mln.Addr().String())
	}
	return ls, nil
}

// newHTTPServer is the API's http.Server.
func newHTTPServer(cfg config.Config, h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.HeaderTimeout.D(),
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      longestRequest(cfg) + 90*time.Second,
		IdleTimeout:       cfg.IdleTimeout.D(),
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(slogWriter{logger}, "", 0),
	}
}

// longestRequest is the longest a request may take: the longest execution
// a plan allows plus the wait for a slot. Writes must outlive it; reads
// are bounded well below it.
func longestRequest(cfg config.Config) time.Duration {
	return time.Duration(cfg.MaxTimeoutS())*time.Second + cfg.QueueTimeout.D()
}

func (ls *listening) close() {
	for _, s := range ls.servers {
		_ = s.Close()
	}
}

// shutdown lets the requests running end, until ctx does.
func (ls *listening) shutdown(ctx context.Context, logger *slog.Logger) {
	for _, s := range ls.servers {
		if err := s.Shutdown(ctx); err != nil {
			logger.Warn("shutdown", "error", err)
		}
	}
}

// openStore opens PostgreSQL when the URL says so, else SQLite in the data
// directory. The description never contains the URL: it may hold a
// password.
func openStore(ctx context.Context, cfg config.Config) (store.Store, string, error) {
	if cfg.UsesPostgres() {
		st, err := postgres.Open(ctx, cfg.DatabaseURL)
		if err != nil {
			return nil, "", fmt.Errorf("opening PostgreSQL: %w", err)
		}
		return st, "postgresql", nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, "", fmt.Errorf("creating data directory: %w", err)
	}
	path := sqlitePath(cfg)
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, "", fmt.Errorf("opening SQLite: %w", err)
	}
	return st, "sqlite " + path, nil
}

// sqlitePath is where the SQLite store of cfg lives.
func sqlitePath(cfg config.Config) string { return filepath.Join(cfg.DataDir, "vertal.db") }

// newDriver builds the configured sandbox driver and the pre-starter the
// warm pool uses with it. stateDir "" is the driver's default; operator
// commands (doctor, bench) pass their own, so their Reap never touches a
// running server's sandboxes.
func newDriver(ctx context.Context, cfg config.Config, stateDir string, logger *slog.Logger) (engine.Driver, pool.Prestarter, func(), error) {
	sub := func(name string) string {
		if stateDir == "" {
			return ""
		}
		return filepath.Join(stateDir, name)
	}
	switch cfg.Driver {
	case "docker":
		d, err := docker.New(ctx, docker.Options{Runtime: cfg.Runtime, Image: cfg.DockerImage, StateDir: sub("docker"), Logger: logger})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("docker driver: %w", err)
		}
		return d, docker.NewPrestarter(d), func() { _ = d.Close() }, nil
	default:
		if fi, err := os.Stat(cfg.RootFS()); err != nil || !fi.IsDir() {
			return nil, nil, nil, fmt.Errorf("no sandbox root filesystem at %s: build it with `vertal image build` or point --image-dir at one", cfg.RootFS())
		}
		d, err := oci.New(ctx, oci.Options{Runtime: cfg.Runtime, StateDir: sub("oci"), Logger: logger})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("oci driver: %w", err)
		}
		return d, oci.NewPrestarter(d), func() { _ = d.Close() }, nil
	}
}

// reapUIDLeases releases the leases of the host-wide uid pool that both
// drivers lease from whose holders died (see uidpool.Pool.Reap).
func reapUIDLeases() (int, error) {
	p, err := uidpool.New("", 0, 0)
	if err != nil {
		return 0, err
	}
	return p.Reap()
}

func clientLanguages(ls []engine.Language) []client.Language {
	out := make([]client.Language, 0, len(ls))
	for _, l := range ls {
		out = append(out, client.Language{Name: l.Name, Version: l.Version, Aliases: lang.Aliases(l.Name)})
	}
	return out
}

// devKey gives the development tenant a key on the first start and prints
// it with the lines to use it; later starts say where it went.
func devKey(ctx context.Context, e *env, st store.Store, base, hint string) error {
	keys, err := st.ListKeys(ctx, devTenant)
	if err != nil {
		return fmt.Errorf("dev mode: listing keys: %w", err)
	}
	for _, k := range keys {
		if k.RevokedAt.IsZero() {
			fmt.Fprintf(e.Stdout, "Development tenant %q already has a key (printed on its first start).\n"+
				"  A new one: %s\n", devTenant, hint)
			return nil
		}
	}
	secret, k, err := api.CreateKey(ctx, st, devTenant, "pro", time.Now())
	if err != nil {
		return fmt.Errorf("dev mode: %w", err)
	}
	fmt.Fprintf(e.Stdout, "Development key for tenant %q (plan pro, id %s). It is shown only now:\n\n  %s\n\n", devTenant, k.ID, secret)
	fmt.Fprintf(e.Stdout, "  export KUBO_API_URL=%s/api KUBO_API_KEY=%s\n", base, secret)
	fmt.Fprintf(e.Stdout, "  curl -X POST $KUBO_API_URL/v1/executions -H \"Authorization: Bearer $KUBO_API_KEY\" \\\n"+
		"    -H \"Content-Type: application/json\" -d '{\"language\": \"python\", \"code\": \"print(6 * 7)\"}'\n")
	return nil
}

// createKeyHint is the create-key command line that acts on the server's
// own database: it names a --data-dir that is not the default (made
// absolute, since the operator may run it elsewhere), or the PostgreSQL
// URL with its password masked.
func createKeyHint(cfg config.Config, tenant string) string {
	hint := "vertal create-key " + tenant + " --plan pro"
	switch {
	case cfg.UsesPostgres():
		u := cfg.DatabaseURL
		if pu, err := url.Parse(u); err == nil {
			u = pu.Redacted()
		}
		hint += " --database-url " + shellArg(u)
	case cfg.DataDir != config.DefaultDataDir:
		dir := cfg.DataDir
		if abs, err := filepath.Abs(dir); err == nil {
			dir = abs
		}
		hint += " --data-dir " + shellArg(dir)
	}
	return hint
}

// shellArg quotes s for a POSIX shell when it holds anything but plain
// path characters.
func shellArg(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+:@,=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// slogWriter sends net/http's own complaints (TLS garbage, hijack errors)
// to the structured log.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn(strings.TrimSpace(string(p)), "source", "net/http")
	return len(p), nil
}

var _ io.Writer = slogWriter{}

// collectImageVersions deletes replaced image versions once no sandbox
// runs on them (vertal image build does too, but only when it runs).
func collectImageVersions(ctx context.Context, images []config.Image, logger *slog.Logger) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, img := range images {
			removed, err := image.GC(img.Dir, image.RetireGrace)
			if err != nil {
				logger.Warn("removing unused image versions", "image", img.Name, "error", err)
			}
			for _, v := range removed {
				logger.Info("removed unused image version", "image", img.Name, "version", v)
			}
		}
	}
}

// clientImages is what the MCP tool description lists of each image.
func clientImages(images []config.Image) []client.Image {
	var out []client.Image
	for _, img := range images {
		ci := client.Image{Name: img.Name, Languages: clientLanguages(img.Languages), Packages: []client.Package{}}
		if m, err := image.ReadManifest(img.Dir); err == nil {
			for _, p := range m.Main() {
				ci.Packages = append(ci.Packages, client.Package{Name: p.Name, Version: p.Version, Source: p.Source})
			}
		}
		out = append(out, ci)
	}
	return out
}
