package regionctl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/edgeguard/edgeguard/pkg/region"
	"github.com/edgeguard/edgeguard/pkg/shedder"
)

// storedShedder reads a region's shedder settings: the stored JSON over the
// defaults (the defaults alone when nothing is stored).
func (s *session) storedShedder(r string) (cfg shedder.Config, raw []byte, index uint64, err error) {
	raw, index, err = s.get(r, s.layout.Shedder(r))
	if err != nil {
		return shedder.Config{}, nil, 0, err
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return shedder.DefaultConfig(), raw, index, nil
	}
	cfg, err = shedder.ParseConfig(raw)
	if err != nil {
		return shedder.Config{}, raw, index, &codedError{code: ExitInvalid, err: err}
	}
	return cfg, raw, index, nil
}

// shedder get --region R
func (a *app) shedderGet(args []string) error {
	fs := a.flags("shedder get", "--region R")
	var r string
	regionVar(fs, &r)
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("shedder get takes no arguments, got %q", pos)
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	key := s.layout.Shedder(r)
	cfg, raw, index, err := s.storedShedder(r)
	if err != nil {
		if !isInvalid(err) {
			return err
		}
		return a.reportInvalid(fmt.Sprintf("the stored shedder settings of %s (%s)", r, key), problemsOf(err),
			"; `shedder set --reset` starts over from the defaults")
	}
	stored := len(bytes.TrimSpace(raw)) > 0
	if a.json() {
		out := map[string]any{"region": r, "key": key, "stored": stored, "modify_index": index, "settings": cfg}
		if stored {
			out["version"] = shortHash(raw)
		}
		a.emitJSON(out)
		return nil
	}
	if stored {
		a.printf("# shedder settings of %s (%s, ModifyIndex %d, version %s): stored values over the defaults\n", r, key, index, shortHash(raw))
	} else {
		a.printf("# shedder settings of %s: defaults (%s is absent)\n", r, key)
	}
	for _, kv := range settings(cfg) {
		a.printf("%s=%s\n", kv[0], kv[1])
	}
	return nil
}

// settings lists cfg as the key=value pairs `shedder set` accepts.
func settings(cfg shedder.Config) [][2]string {
	rulesOf := func(rs []shedder.PrefixRule) string {
		parts := make([]string, len(rs))
		for i, r := range rs {
			parts[i] = r.Prefix + ":" + r.Tier.String()
			if r.TrustedOnly {
				parts[i] += ":trusted"
			}
		}
		return strings.Join(parts, ",")
	}
	vals := map[string]string{
		"enabled":                   strconv.FormatBool(cfg.Enabled),
		"good":                      strconv.FormatFloat(cfg.Good, 'g', -1, 64),
		"bad":                       strconv.FormatFloat(cfg.Bad, 'g', -1, 64),
		"start_after":               cfg.StartAfter.String(),
		"full_after":                cfg.FullAfter.String(),
		"smoothing":                 cfg.Smoothing.String(),
		"share_window":              cfg.ShareWindow.String(),
		"queue_timeout":             cfg.QueueTimeout.String(),
		"critical_queue_timeout":    cfg.CriticalQueueTimeout.String(),
		"queue_size":                strconv.Itoa(cfg.QueueSize),
		"tiers.priority_header":     cfg.Tiers.PriorityHeader,
		"tiers.test_mode_header":    cfg.Tiers.TestModeHeader,
		"tiers.api_key_header":      cfg.Tiers.APIKeyHeader,
		"tiers.paths":               rulesOf(cfg.Tiers.Paths),
		"tiers.api_keys":            rulesOf(cfg.Tiers.APIKeys),
		"tiers.read_methods":        strings.Join(cfg.Tiers.ReadMethods, ","),
		"runtime_lag_bad":           cfg.RuntimeLagBad.String(),
		"adaptive.enabled":          strconv.FormatBool(cfg.Adaptive.Enabled),
		"adaptive.initial_limit":    strconv.Itoa(cfg.Adaptive.InitialLimit),
		"adaptive.min_limit":        strconv.Itoa(cfg.Adaptive.MinLimit),
		"adaptive.max_limit":        strconv.Itoa(cfg.Adaptive.MaxLimit),
		"adaptive.window":           cfg.Adaptive.Window.String(),
		"adaptive.min_rtt_window":   cfg.Adaptive.MinRTTWindow.String(),
		"adaptive.buffer":           strconv.FormatFloat(cfg.Adaptive.Buffer, 'g', -1, 64),
		"adaptive.smoothing":        strconv.FormatFloat(cfg.Adaptive.Smoothing, 'g', -1, 64),
		"adaptive.shares.test":      strconv.FormatFloat(cfg.Adaptive.Shares.Test, 'g', -1, 64),
		"adaptive.shares.read":      strconv.FormatFloat(cfg.Adaptive.Shares.Read, 'g', -1, 64),
		"adaptive.shares.write":     strconv.FormatFloat(cfg.Adaptive.Shares.Write, 'g', -1, 64),
		"adaptive.shares.critical":  strconv.FormatFloat(cfg.Adaptive.Shares.Critical, 'g', -1, 64),
		"host_share.enabled":        strconv.FormatBool(cfg.HostShare.Enabled),
		"host_share.tracked_hosts":  strconv.Itoa(cfg.HostShare.TrackedHosts),
		"host_share.weights":        cfg.HostShare.FormatWeights(),
		"host_share.default_weight": strconv.Itoa(cfg.HostShare.DefaultWeight),
	}
	out := make([][2]string, 0, len(shedder.SettingKeys))
	for _, k := range shedder.SettingKeys {
		out = append(out, [2]string{k, vals[k]})
	}
	return out
}

// shedder set --region R [--reset] key=value...
func (a *app) shedderSet(args []string) error {
	fs := a.flags("shedder set", "--region R [--reset] [--message M] [--author A] [--force [--yes]] [--canary POP --for DURATION] key=value...\n\nKeys: "+
		strings.Join(shedder.SettingKeys, ", ")+"\nLists are comma-separated (tiers.paths=/healthcheck:critical:trusted,/internal/synthetic:test; ':trusted' applies a rule to trusted proxies only, and a critical rule needs it); host_share.weights=a.example:2,*.big.example:4 weights hosts' shares; an empty value clears a list.")
	var r string
	var reset bool
	regionVar(fs, &r)
	fs.BoolVar(&reset, "reset", false, "apply the settings to the defaults instead of the stored settings")
	m := a.metaFlags(fs)
	var yes bool
	fs.BoolVar(&yes, "yes", false, "do not ask for confirmation on a terminal (asked only with --force)")
	a.forceFlag(fs, &yes)
	cf := a.canaryFlags(fs, "the region's shedder settings at that PoP only")
	var prom string
	fs.StringVar(&prom, "prometheus", a.env("PROMETHEUS_URL"), "with --canary: Prometheus `URL` scraping the edges, which the canary is judged on (default $PROMETHEUS_URL)")
	pos, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if cf.pop != "" {
		if err := cf.checkRun(prom); err != nil {
			return err
		}
	}
	if len(pos) == 0 && !reset {
		return usagef("shedder set needs key=value settings (keys: %s)", strings.Join(shedder.SettingKeys, ", "))
	}
	kv := map[string]string{}
	for _, arg := range pos {
		k, v, ok := strings.Cut(arg, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok || k == "":
			return usagef("shedder set: %q is not key=value", arg)
		case hasKey(kv, k):
			return usagef("shedder set: %s given twice", k)
		}
		kv[k] = v
	}
	// Typos and unreadable values before anything is fetched: they do not
	// depend on the stored settings.
	if shedder.CheckSettings(kv) != nil {
		def := shedder.DefaultConfig()
		_, all := shedder.ApplySettings(def, kv) // the rest of the values' problems too, in one pass
		return a.reportInvalid("shedder settings", settingProblems(def, kv, all), "; nothing was written")
	}
	if err := a.fillMeta(m); err != nil {
		return err
	}
	s, err := a.connectRegion(r)
	if err != nil {
		return err
	}
	defer s.close()
	key := s.layout.Shedder(r)
	cur, raw, index, err := s.storedShedder(r)
	switch {
	case err != nil && !isInvalid(err):
		return err
	case err != nil && !reset:
		return a.reportInvalid(fmt.Sprintf("the stored shedder settings of %s (%s)", r, key), problemsOf(err),
			"; nothing was written (add --reset to start from the defaults)")
	case reset:
		cur = shedder.DefaultConfig()
	}
	next, err := shedder.ApplySettings(cur, kv)
	if err != nil {
		return a.reportInvalid("shedder settings", settingProblems(cur, kv, err), "; nothing was written")
	}
	data, err := json.MarshalIndent(next, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding shedder settings: %w", err)
	}
	data = append(data, '\n')
	parsed, err := shedder.ParseConfig(data) // what the edges will do with it
	if err != nil {
		return a.reportInvalid("shedder settings", problemsOf(err), "; nothing was written")
	}
	version := shortHash(data)
	res := pushResult{Region: r, Document: "shedder", Key: key, DocumentVersion: version, PreviousVersion: ""}
	if len(bytes.TrimSpace(raw)) > 0 {
		res.PreviousVersion = shortHash(raw)
	}
	changed := describe(pos)
	write := func(res pushResult) pushResult {
		e, err := s.push(r, key, data, index, region.Entry{
			Kind: region.KindShedder, Version: version, Author: m.author, Host: m.host, Message: m.message,
		})
		if err != nil {
			return s.failed(res, err)
		}
		res.Status, res.Seq = "ok", e.Seq
		s.afterPush(&res, *m, false, false)
		return res
	}
	if cf.pop != "" && !bytes.Equal(raw, data) {
		before := "defaults"
		if len(bytes.TrimSpace(raw)) > 0 {
			before = res.PreviousVersion
		}
		return a.runCanary(s, prom, cf, candidate{
			kind: region.CanaryShedder, region: r, doc: data,
			what: "shedder settings version", version: shedder.SettingsVersion(parsed), before: before,
			reported: func(e region.Edge) string { return e.ShedderVersion },
			promote: func() ([]pushResult, []string) {
				res := write(res)
				return []pushResult{res}, []string{shedderLine(r, res, changed)}
			},
		})
	}
	if bytes.Equal(raw, data) {
		res.Status = "unchanged"
	} else {
		res = write(res)
	}
	if a.json() {
		a.emitJSON(map[string]any{"results": []pushResult{res}, "settings": next,
			"exit_code": res.ExitCode, "reason": reasonOf(res.ExitCode)})
	}
	if res.ExitCode != ExitOK {
		return &codedError{code: res.ExitCode, msg: res.Error}
	}
	if !a.json() {
		a.printf("%s\n", shedderLine(r, res, changed))
	}
	return nil
}

// shedderLine is shedder set's line for res (ok or unchanged).
func shedderLine(r string, res pushResult, changed string) string {
	if res.Status != "ok" {
		return fmt.Sprintf("%s: unchanged: the shedder settings already hold %s", r, changed)
	}
	line := fmt.Sprintf("%s: ok: shedder settings updated (%s), version %s -> %s", r, changed, dash(res.PreviousVersion), res.DocumentVersion)
	if res.HistoryPruned > 0 {
		line += "; pruned " + entries(res.HistoryPruned, "history ")
	}
	if res.PartsPending > 0 {
		line += fmt.Sprintf("; %s no manifest names kept until the edges of %s converge", plural(res.PartsPending, "stored part"), r)
	}
	if res.Warning != "" {
		line += "; warning: " + res.Warning
	}
	return line
}

// settingProblems lists every problem with kv: ApplySettings stops at
// unparsable values before validating, so the values that did parse are
// applied again to report their validation problems too.
func settingProblems(cur shedder.Config, kv map[string]string, err error) []problem {
	probs := problemsOf(err)
	parsed := map[string]string{}
	for k, v := range kv {
		if !strings.Contains(err.Error(), "invalid shedder config: "+k+": ") {
			parsed[k] = v
		}
	}
	if len(parsed) == len(kv) {
		return probs // the problems were validation problems already
	}
	if _, err := shedder.ApplySettings(cur, parsed); err != nil {
		seen := map[string]bool{}
		for _, p := range probs {
			seen[p.Message] = true
		}
		for _, p := range problemsOf(err) {
			if !seen[p.Message] {
				probs = append(probs, p)
			}
		}
	}
	return probs
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

func describe(pos []string) string {
	if len(pos) == 0 {
		return "reset to the defaults"
	}
	return strings.Join(pos, " ")
}
