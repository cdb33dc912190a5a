// promql-check parses every PromQL expression of Vigil's Grafana dashboards and Prometheus rule
// files with Prometheus' own parser (github.com/prometheus/prometheus, pinned in go.mod) and
// prints, as JSON, the metric names they select and the names recording rules define. The
// controller's tests compare those names with what a live `vigil run` exports, so a renamed
// metric breaks the build rather than the dashboard.
//
//	promql-check FILE...   # *.json: a Grafana dashboard; *.yaml / *.yml: a Prometheus rule file
//
// Exit status 1, with one line per problem on stderr naming the file and the panel, variable or
// rule, when an expression does not parse, a selector names no metric, a rule file is invalid
// (checked as promtool checks it: rulefmt), or a dashboard uses a template variable it does not
// declare. Exit status 2 on bad usage or an unreadable file.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// expression is one PromQL expression and where it was found.
type expression struct {
	File  string `json:"file"`
	Where string `json:"where"`
	Query string `json:"query"`
	// Metrics are the metric names its selectors name, sorted.
	Metrics []string `json:"metrics"`
}

// report is what the tool prints on success.
type report struct {
	Expressions []expression `json:"expressions"`
	// Metrics maps every metric name an expression selects to the places that select it.
	Metrics map[string][]string `json:"metrics"`
	// Recorded lists the names recording rules define (they are not exported by Vigil).
	Recorded []string `json:"recorded"`
}

type checker struct {
	parser   parser.Parser
	report   report
	problems []string
}

func main() {
	if len(os.Args) < 2 || strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprintln(os.Stderr, "usage: promql-check FILE... (*.json: Grafana dashboard; *.yaml/*.yml: Prometheus rule file)")
		os.Exit(2)
	}
	c := &checker{
		parser: parser.NewParser(parser.Options{}),
		report: report{Expressions: []expression{}, Metrics: map[string][]string{}, Recorded: []string{}},
	}
	for _, file := range os.Args[1:] {
		content, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
			os.Exit(2)
		}
		switch {
		case strings.HasSuffix(file, ".json"):
			c.dashboard(file, content)
		case strings.HasSuffix(file, ".yaml") || strings.HasSuffix(file, ".yml"):
			c.rules(file, content)
		default:
			fmt.Fprintf(os.Stderr, "%s: neither a dashboard (.json) nor a rule file (.yaml, .yml)\n", file)
			os.Exit(2)
		}
	}
	if len(c.problems) > 0 {
		for _, p := range c.problems {
			fmt.Fprintln(os.Stderr, p)
		}
		os.Exit(1)
	}
	sort.Strings(c.report.Recorded)
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	out.SetEscapeHTML(false)
	if err := out.Encode(c.report); err != nil {
		fmt.Fprintf(os.Stderr, "writing the report: %v\n", err)
		os.Exit(2)
	}
}

func (c *checker) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// expr parses one expression and records the metric names its selectors name.
func (c *checker) expr(file, where, query string) {
	parsed, err := c.parser.ParseExpr(query)
	if err != nil {
		c.problem("%s: %s: %q does not parse: %v", file, where, query, err)
		return
	}
	names := map[string]bool{}
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := selectorName(vs)
		if name == "" {
			c.problem("%s: %s: selector %s names no metric, so it cannot be checked against what Vigil exports", file, where, vs)
			return nil
		}
		names[name] = true
		return nil
	})
	metrics := make([]string, 0, len(names))
	for n := range names {
		metrics = append(metrics, n)
		c.report.Metrics[n] = append(c.report.Metrics[n], file+": "+where)
	}
	sort.Strings(metrics)
	c.report.Expressions = append(c.report.Expressions, expression{File: file, Where: where, Query: query, Metrics: metrics})
}

// selectorName is the metric a selector names: its name, or an equality matcher on __name__.
func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// rules checks a rule file as promtool does (rulefmt: structure, names, expressions, templates),
// then collects every expression's metrics, alerting and recording rules alike.
func (c *checker) rules(file string, content []byte) {
	groups, errs := rulefmt.Parse(content, false, model.LegacyValidation, c.parser, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, e := range errs {
		c.problem("%s: %v", file, e)
	}
	if len(errs) > 0 || groups == nil {
		return
	}
	for _, g := range groups.Groups {
		for i, r := range g.Rules {
			// Numbered from 1, as rulefmt's errors number them.
			where := fmt.Sprintf("group %q rule %d", g.Name, i+1)
			if r.Record != "" {
				where += fmt.Sprintf(" (record %s)", r.Record)
				c.report.Recorded = append(c.report.Recorded, r.Record)
			} else {
				where += fmt.Sprintf(" (alert %s)", r.Alert)
			}
			c.expr(file, where, r.Expr)
		}
	}
}

// The parts of a Grafana dashboard that hold PromQL.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name string `json:"name"`
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
}

type panel struct {
	ID      int     `json:"id"`
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

type variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// query is a query variable's query: a string, or an object with a `query` string.
func (v variable) query() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if json.Unmarshal(v.Query, &o) == nil {
		return o.Query
	}
	return ""
}

// Grafana's template variables: ${name}, ${name:format}, $name, [[name]].
var variableRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)|\[\[([A-Za-z_][A-Za-z0-9_]*)(?::[^\]]*)?\]\]`)

// Grafana's built-in variables, by the value they are replaced with for parsing.
var builtins = map[string]string{
	"__interval": "5m", "__rate_interval": "5m", "__range": "5m",
	"__interval_ms": "300000", "__range_ms": "300000", "__range_s": "300",
}

// substitute replaces template variables with values that parse where they stand: an interval
// variable with a duration, any other with a word (variables stand in label values or regexes).
func substitute(query string, declared map[string]string) (string, []string) {
	var unknown []string
	out := variableRef.ReplaceAllStringFunc(query, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		if v, ok := builtins[name]; ok {
			return v
		}
		kind, ok := declared[name]
		switch {
		case !ok:
			unknown = append(unknown, "$"+name)
			return ref
		case kind == "interval":
			return "5m"
		default:
			return "x"
		}
	})
	return out, unknown
}

// Grafana's Prometheus variable queries that hold a selector or an expression.
var (
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	labelNames  = regexp.MustCompile(`^\s*label_values\(\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	queryResult = regexp.MustCompile(`^\s*query_result\((.*)\)\s*$`)
)

func (c *checker) dashboard(file string, content []byte) {
	var d dashboard
	if err := json.Unmarshal(content, &d); err != nil {
		c.problem("%s: not a dashboard: %v", file, err)
		return
	}
	declared := map[string]string{}
	for _, v := range d.Templating.List {
		declared[v.Name] = v.Type
	}
	check := func(where, query string) {
		q, unknown := substitute(query, declared)
		if len(unknown) > 0 {
			c.problem("%s: %s: uses %s, which the dashboard does not declare", file, where, strings.Join(unknown, ", "))
			return
		}
		c.expr(file, where, q)
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		where := fmt.Sprintf("variable %q", v.Name)
		q := v.query()
		switch {
		case labelValues.MatchString(q):
			check(where, labelValues.FindStringSubmatch(q)[1])
		case queryResult.MatchString(q):
			check(where, queryResult.FindStringSubmatch(q)[1])
		case labelNames.MatchString(q):
			// label_values(label) selects no metric.
		default:
			c.problem("%s: %s: query %q is no Prometheus variable query this tool reads (label_values, query_result)", file, where, q)
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			check(fmt.Sprintf("annotation %q", a.Name), a.Expr)
		}
	}
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			for _, t := range p.Targets {
				where := fmt.Sprintf("panel %q (id %d) target %s", p.Title, p.ID, t.RefID)
				if strings.TrimSpace(t.Expr) == "" {
					c.problem("%s: %s: no expression", file, where)
					continue
				}
				check(where, t.Expr)
			}
			if len(p.Targets) == 0 && p.Type != "row" && p.Type != "text" {
				c.problem("%s: panel %q (id %d): no query", file, p.Title, p.ID)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
}
