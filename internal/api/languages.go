package api

import (
	"net/http"

	"github.com/kuboprotocol/vertal2kubo/internal/execution"
)

func (s *Server) listLanguages(w http.ResponseWriter, r *http.Request, _ *Caller) error {
	return s.writeJSON(w, r, http.StatusOK, struct {
		Languages []execution.LanguageInfo `json:"languages"`
	}{s.exec.Languages().List()})
}
