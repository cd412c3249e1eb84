// Package sqlstore is what the SQLite and PostgreSQL stores share about
// the executions table: one column order for reading it, the statements
// that write a whole execution or its webhook, and their arguments. Both
// dialects take $N placeholders, so one text serves both; a store only
// says how it keeps a time.
package sqlstore

import (
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/store"
)

// ExecutionColumns is the order in which both stores scan an execution.
const ExecutionColumns = `id, tenant, key_id, request_id, language, status, stdout, stderr,
	exit_code, duration_ms, truncated, sandbox_seconds, cpu_seconds, peak_memory_bytes,
	created_at, started_at, finished_at, cancel_requested, purged, files, files_truncated,
	async, request, owner, reason, webhook_url, webhook_delivery_id, webhook_state,
	webhook_attempts, webhook_last_status, webhook_last_error, image, image_version`

// InsertExecution and UpdateExecution write every column a caller sets,
// with ExecutionArgs; $1 is the id in both. cancel_requested and purged
// are the store's own and are left alone.
const (
	InsertExecution = `INSERT INTO executions (id, tenant, key_id, request_id, language, status,
		stdout, stderr, exit_code, duration_ms, truncated, sandbox_seconds, cpu_seconds, peak_memory_bytes,
		created_at, started_at, finished_at, files, files_truncated, async, request, owner, reason,
		webhook_url, webhook_delivery_id, webhook_state, webhook_attempts, webhook_last_status, webhook_last_error,
		image, image_version)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
		$21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31)`
	UpdateExecution = `UPDATE executions SET tenant = $2, key_id = $3, request_id = $4, language = $5, status = $6,
		stdout = $7, stderr = $8, exit_code = $9, duration_ms = $10, truncated = $11, sandbox_seconds = $12,
		cpu_seconds = $13, peak_memory_bytes = $14, created_at = $15, started_at = $16, finished_at = $17,
		files = $18, files_truncated = $19, async = $20, request = $21, owner = $22, reason = $23,
		webhook_url = $24, webhook_delivery_id = $25, webhook_state = $26, webhook_attempts = $27,
		webhook_last_status = $28, webhook_last_error = $29, image = $30, image_version = $31
		WHERE id = $1`
)

// PendIdempotency names execution $1 of tenant $2 as the one the running
// claim of key $3 accepted; SettleIdempotency completes the running claim
// that names execution $1 of tenant $2 with it. Both leave a completed
// claim alone.
const (
	PendIdempotency   = `UPDATE idempotency SET pending_id = $1 WHERE tenant = $2 AND idem_key = $3 AND execution_id = ''`
	SettleIdempotency = `UPDATE idempotency SET execution_id = $1 WHERE tenant = $2 AND pending_id = $1 AND execution_id = ''`
)

// UpdateWebhook replaces the delivery state of execution $7 of tenant $8,
// with WebhookArgs then the id and the tenant; it changes no row of an
// execution without a webhook.
const UpdateWebhook = `UPDATE executions SET webhook_url = $1, webhook_delivery_id = $2, webhook_state = $3,
	webhook_attempts = $4, webhook_last_status = $5, webhook_last_error = $6
	WHERE id = $7 AND tenant = $8 AND webhook_url IS NOT NULL`

// WebhookArgs are the webhook_ columns of w in ExecutionColumns' order. A
// nil w is a NULL webhook_url, which is how a scan tells "no webhook".
func WebhookArgs(w *store.Webhook) []any {
	if w == nil {
		return []any{nil, "", "", 0, 0, ""}
	}
	return []any{w.URL, w.DeliveryID, w.State, w.Attempts, w.LastStatus, w.LastError}
}

// ExecutionArgs are the arguments of InsertExecution and UpdateExecution.
// at is how the store keeps a time; a zero StartedAt or FinishedAt is NULL.
func ExecutionArgs(e store.Execution, at func(time.Time) any) ([]any, error) {
	files, err := store.MarshalFiles(e.Files)
	if err != nil {
		return nil, err
	}
	null := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return at(t)
	}
	args := []any{e.ID, e.Tenant, e.KeyID, e.RequestID, e.Language, e.Status,
		[]byte(e.Stdout), []byte(e.Stderr), e.ExitCode, e.DurationMS, e.Truncated,
		e.SandboxSeconds, e.CPUSeconds, e.PeakMemoryBytes, at(e.CreatedAt), null(e.StartedAt),
		null(e.FinishedAt), files, e.FilesTruncated, e.Async, e.Request, e.Owner, e.Reason}
	args = append(args, WebhookArgs(e.Webhook)...)
	return append(args, e.Image, e.ImageVersion), nil
}
