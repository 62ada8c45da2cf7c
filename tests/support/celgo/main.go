// celgo evaluates CEL as kube-apiserver v1.36's ValidatingAdmissionPolicy does: cel-go with
// Kubernetes' base environment (k8s.io/apiserver/pkg/cel/environment, stored expressions), the
// variables of a policy as dyn (and our `job`), no type information about them. It is the oracle
// of tests/unit/test_cel_oracle.py, built from the Go module cache by tests/support/celgo.py.
//
// stdin: one JSON object per line, {"expr": "...", "vars": {...}}; stdout: one JSON object per
// line, {"compile_error": "...", "stage": "parse" | "check" | "program"} (check: the type checker
// and the environment's validators) or {"type": "...", "value": V} or {"type": "...", "error": "..."}
// (or {"panic": "..."} where cel-go panics)
// where V is a value tagged with its CEL type ({"int": "1"}, {"list": [V...]}, ...).
// `celgo functions` lists every function and overload of the environment.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/cel/environment"
)

var variables = []string{"object", "oldObject", "request", "params", "namespaceObject", "job", "variables"}

func main() {
	options := []cel.EnvOption{}
	for _, name := range variables {
		options = append(options, cel.Variable(name, cel.DynType))
	}
	extended, err := environment.MustBaseEnvSet(version.MajorMinor(1, 36)).Extend(
		environment.VersionedOptions{IntroducedVersion: version.MajorMinor(1, 0), EnvOptions: options})
	if err != nil {
		panic(err)
	}
	env, err := extended.Env(environment.StoredExpressions)
	if err != nil {
		panic(err)
	}
	if len(os.Args) > 1 && os.Args[1] == "functions" {
		functions(env)
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var request struct {
			Expr string         `json:"expr"`
			Vars map[string]any `json:"vars"`
		}
		decoder := json.NewDecoder(strings.NewReader(in.Text()))
		decoder.UseNumber()
		if err := decoder.Decode(&request); err != nil {
			panic(err)
		}
		if err := out.Encode(evaluate(env, request.Expr, request.Vars)); err != nil {
			panic(err)
		}
	}
}

func evaluate(env *cel.Env, expr string, vars map[string]any) (result map[string]any) {
	defer func() {
		if recovered := recover(); recovered != nil { // cel-go panics on a few inputs; the API server recovers too
			result = map[string]any{"panic": fmt.Sprint(recovered)}
		}
	}()
	parsed, issues := env.Parse(expr)
	if issues != nil && issues.Err() != nil {
		return map[string]any{"compile_error": issues.Err().Error(), "stage": "parse"}
	}
	ast, issues := env.Check(parsed)
	if issues != nil && issues.Err() != nil {
		return map[string]any{"compile_error": issues.Err().Error(), "stage": "check"}
	}
	program, err := env.Program(ast)
	if err != nil {
		return map[string]any{"compile_error": err.Error(), "stage": "program"}
	}
	activation := map[string]any{}
	for _, name := range variables {
		activation[name] = nil
	}
	for name, value := range vars {
		activation[name] = numbers(value)
	}
	result = map[string]any{"type": ast.OutputType().String()}
	value, _, err := program.Eval(activation)
	if err != nil {
		result["error"] = err.Error()
	} else {
		result["value"] = tagged(value)
	}
	return result
}

// numbers gives JSON numbers the types the API server's decoder gives them: int64 when the
// number's text is an integer that fits, float64 otherwise.
func numbers(value any) any {
	switch v := value.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return i
		}
		f, _ := strconv.ParseFloat(string(v), 64)
		return f
	case map[string]any:
		for key, item := range v {
			v[key] = numbers(item)
		}
	case []any:
		for i, item := range v {
			v[i] = numbers(item)
		}
	}
	return value
}

func tagged(value ref.Val) any {
	switch v := value.(type) {
	case types.Null:
		return map[string]any{"null": nil}
	case types.Bool:
		return map[string]any{"bool": bool(v)}
	case types.Int:
		return map[string]any{"int": strconv.FormatInt(int64(v), 10)}
	case types.Uint:
		return map[string]any{"uint": strconv.FormatUint(uint64(v), 10)}
	case types.Double:
		return map[string]any{"double": strconv.FormatFloat(float64(v), 'g', -1, 64)}
	case types.String:
		return map[string]any{"string": string(v)}
	case types.Bytes:
		return map[string]any{"bytes": base64.StdEncoding.EncodeToString([]byte(v))}
	case types.Timestamp:
		return map[string]any{"timestamp": v.Time.UTC().Format(time.RFC3339Nano)}
	case types.Duration:
		return map[string]any{"duration": strconv.FormatInt(int64(v.Duration), 10)}
	case *types.Optional:
		if !v.HasValue() {
			return map[string]any{"optional": nil}
		}
		return map[string]any{"optional": []any{tagged(v.GetValue())}}
	case ref.Type:
		return map[string]any{"type": v.TypeName()}
	}
	if list, ok := value.(traits.Lister); ok && value.Type() == types.ListType {
		items := []any{}
		for it := list.Iterator(); it.HasNext() == types.True; {
			items = append(items, tagged(it.Next()))
		}
		return map[string]any{"list": items}
	}
	if mapper, ok := value.(traits.Mapper); ok && value.Type() == types.MapType {
		entries := []any{}
		for it := mapper.Iterator(); it.HasNext() == types.True; {
			key := it.Next()
			entries = append(entries, []any{tagged(key), tagged(mapper.Get(key))})
		}
		return map[string]any{"map": entries}
	}
	return map[string]any{"other": value.Type().TypeName(), "text": fmt.Sprintf("%v", value.Value())}
}

func functions(env *cel.Env) {
	declared := env.Functions()
	names := make([]string, 0, len(declared))
	for name := range declared {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, overload := range declared[name].OverloadDecls() {
			args := []string{}
			for _, arg := range overload.ArgTypes() {
				args = append(args, arg.String())
			}
			fmt.Printf("%s\t%s\t%v\t%s\t%s\n", name, overload.ID(), overload.IsMemberFunction(),
				strings.Join(args, ", "), overload.ResultType().String())
		}
	}
	for _, macro := range env.Macros() {
		fmt.Printf("macro\t%s\t%d\t%v\n", macro.Function(), macro.ArgCount(), macro.IsReceiverStyle())
	}
}
