// Command olm-validate checks an OLM bundle directory (manifests/ and metadata/) with
// operator-framework's own validators, the ones operator-sdk's `bundle validate` draws on:
// the bundle is loaded by manifests.GetBundleFromDir, then checked by the default bundle
// validators (ClusterServiceVersion, CustomResourceDefinition, bundle), OperatorHub's
// (OperatorHubV2, standard capabilities, standard categories) and the good-practices validator.
//
//	olm-validate DIR
//
// Prints one JSON document: {"errors": [...], "warnings": [...]}, each finding with the
// validator's manifest name, type, field, value and detail. Exit status: 0 without errors,
// 1 with errors or when DIR is not a loadable bundle (the reason on stderr), 2 on bad usage.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

// finding is one error or warning of a validator, as printed.
type finding struct {
	Manifest string `json:"manifest"`
	Type     string `json:"type"`
	Field    string `json:"field,omitempty"`
	Value    string `json:"value,omitempty"`
	Detail   string `json:"detail"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: olm-validate BUNDLE_DIR")
		os.Exit(2)
	}
	bundle, err := manifests.GetBundleFromDir(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot load the bundle in %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator,
	)
	results := validators.Validate(bundle.ObjectsToValidate()...)
	out := struct {
		Errors   []finding `json:"errors"`
		Warnings []finding `json:"warnings"`
	}{Errors: []finding{}, Warnings: []finding{}}
	for _, r := range results {
		out.Errors = append(out.Errors, findings(r.Name, r.Errors)...)
		out.Warnings = append(out.Warnings, findings(r.Name, r.Warnings)...)
	}
	text, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		fmt.Fprintf(os.Stderr, "cannot print the findings: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(text))
	if len(out.Errors) > 0 {
		os.Exit(1)
	}
}

func findings(manifest string, errs []errors.Error) []finding {
	var out []finding
	for _, e := range errs {
		f := finding{Manifest: manifest, Type: string(e.Type), Field: e.Field, Detail: e.Detail}
		if e.BadValue != nil {
			f.Value = fmt.Sprintf("%v", e.BadValue)
		}
		if f.Detail == "" {
			f.Detail = e.Error()
		}
		out = append(out, f)
	}
	return out
}
