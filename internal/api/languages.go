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

// listImages answers GET /v1/images: the images the caller's plan may
// run, with their languages and main packages.
func (s *Server) listImages(w http.ResponseWriter, r *http.Request, c *Caller) error {
	return s.writeJSON(w, r, http.StatusOK, struct {
		Images []execution.ImageInfo `json:"images"`
	}{s.exec.Images(*c)})
}
