// The Jinja subset behind chat templates: syntax, whitespace control with HF's trim_blocks/lstrip_blocks,
// statements, expressions, filters, tests, methods, undefined values, trust flags, refusals, limits, and a
// randomized mutation loop over the real family templates. Expected outputs are what jinja2 renders (checked with
// jinja2 3.1.6 under transformers' settings).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "generation/chat_template.h"
#include "test_chat_template_families.h"

namespace tandem::gen {
namespace {

// Every case sees this conversation as `messages`, bos_token "<s>", eos_token "</s>".
const std::vector<Message> kConversation = {{"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello!"}};

Result<std::vector<RenderedPiece>> render_pieces(std::string_view src, std::size_t max_output = 1 << 20) {
  auto tpl = ChatTemplate::parse(src, "chat_template");
  if (!tpl.ok()) return fail(tpl.error());
  ChatTemplateOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  o.max_output_bytes = max_output;
  o.clock = [] { return std::time_t{1733227200}; };  // 2024-12-03 12:00 UTC
  return tpl->render(kConversation, o);
}

std::string render(std::string_view src) {
  auto r = render_pieces(src);
  if (!r.ok()) return "ERROR: " + r.error().message;
  return flatten(*r);
}

struct Case {
  const char* name;
  const char* src;
  const char* expected;
};

// clang-format off
const Case kCases[] = {
  {"dash_strips_all_whitespace", "a  \n {{- 'b' -}} \n c", "abc"},
  {"trim_blocks_eats_newline_after_block", "{% if true %}\nx\n{% endif %}\ny", "x\ny"},
  {"trim_blocks_not_after_output", "{{ 'x' }}\ny", "x\ny"},
  {"lstrip_blocks_strips_indent_before_block", "a\n    {% if true %}b{% endif %}", "a\nb"},
  {"lstrip_blocks_only_at_line_start", "a {% if true %}b{% endif %}", "a b"},
  {"plus_disables_lstrip", "  {%+ if true %}y{% endif %}", "  y"},
  {"plus_disables_trim_blocks", "{% if true +%}\nz{% endif %}", "\nz"},
  {"comment_with_lstrip_and_trim", "a\n  {# note #}\nb", "a\nb"},
  {"comment_dash", "a   {#- note -#}   b", "ab"},
  {"single_trailing_newline_dropped", "x\n\n", "x\n"},
  {"crlf_normalized", "a\r\nb", "a\nb"},
  {"trailing_crlf_dropped", "x\r\n", "x"},
  {"loop_variables", "{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ x }};{% endfor %}",
   "10TrueFalse33a;21FalseFalse32b;32FalseTrue31c;"},
  {"loop_filter_and_length", "{% for x in range(6) if x is odd %}{{ x }}/{{ loop.length }} {% endfor %}", "1/3 3/3 5/3 "},
  {"loop_else", "{% for x in [] %}{{ x }}{% else %}none{% endfor %}", "none"},
  {"loop_tuple_unpacking", "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}", "a=1,b=2,"},
  {"loop_items_filter", "{% for k, v in messages[0] | items %}{{ k }};{% endfor %}", "role;content;"},
  {"loop_over_dict_keys", "{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}", "xy"},
  {"loop_over_string", "{% for c in 'héj' %}[{{ c }}]{% endfor %}", "[h][é][j]"},
  {"break_and_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", "013"},
  {"namespace_accumulates", "{% set ns = namespace(n=0, found=false) %}{% for x in range(4) %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}{{ ns.found }}", "6False"},
  {"set_in_loop_does_not_leak", "{% set y = 1 %}{% for x in range(2) %}{% set y = 5 %}{% endfor %}{{ y }}", "1"},
  {"set_in_if_leaks", "{% if true %}{% set y = 2 %}{% endif %}{{ y }}", "2"},
  {"set_tuple", "{% set a, b = [1, 2] %}{{ b }}{{ a }}", "21"},
  {"block_set", "{% set x %}a{{ 1 + 1 }}{% endset %}[{{ x }}]", "[a2]"},
  {"macro_with_default_and_keyword", "{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}{{ greet('Bo') }}/{{ greet('Al', p='Yo') }}", "Hi Bo/Yo Al"},
  {"macro_missing_argument_is_undefined", "{% macro m(a, b) %}{{ a }}{{ b is defined }}{% endmacro %}{{ m(1) }}", "1False"},
  {"filter_block", "{% filter upper %}ab{{ 'c' }}{% endfilter %}", "ABC"},
  {"generation_block_renders_body", "{% generation %}x{% endgeneration %}", "x"},
  {"slices", "{{ [1,2,3,4][1:3] }}|{{ [1,2,3][-1] }}|{{ 'hello'[::-1] }}|{{ 'héllo'[1:3] }}|{{ [1,2,3][::2] }}|{{ messages[1:] | length }}|{{ [1,2][5:] }}",
   "[2, 3]|3|olleh|él|[1, 3]|2|[]"},
  {"arithmetic_like_python", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ 0.1 + 0.2 }} {{ 10 / 5 }} {{ -3 }} {{ 1e20 }} {{ 0.0001 }} {{ 1.5e-5 }}",
   "3 -4 1 2 3.5 1024 7 0.30000000000000004 2.0 -3 1e+20 0.0001 1.5e-05"},
  {"string_operators", "{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 3 }}|{{ 'x' in 'xyz' }}|{{ 'q' not in 'xyz' }}|{{ 'ab' + 'cd' }}", "a1None|ababab|True|True|abcd"},
  {"string_escapes", "{{ 'it\\'s' }}|{{ \"say \\\"hi\\\"\" }}|{{ 'tab\\tnl\\n' }}|{{ '\\u00e9\\x41' }}|{{ 'a\\\\b' }}|{{ 'a' 'b' }}", "it's|say \"hi\"|tab\tnl\n|éA|a\\b|ab"},
  {"literals_print_like_python", "{{ [none, true, 1.0, 'x', {'k': 'v'}] }}|{{ True }}{{ False }}{{ None }}", "[None, True, 1.0, 'x', {'k': 'v'}]|TrueFalseNone"},
  {"comparisons", "{{ 1 < 2 }}{{ 'a' < 'b' }}{{ [1, 2] == [1, 2] }}{{ 1 == 1.0 }}{{ 1 != '1' }}{{ 2 >= 3 }}", "TrueTrueTrueTrueTrueFalse"},
  {"chained_comparisons", "{{ 1 < 2 < 3 }}{{ 3 > 2 > 1 }}{{ 1 < 3 < 2 }}{{ (3 > 2) > 1 }}{{ 1 == 1 in [1] }}", "TrueTrueFalseFalseTrue"},
  {"and_or_return_operands", "{{ 0 or 'b' }}|{{ 'a' and 'b' }}|{{ none or [] }}|{{ not 0 }}", "b|b|[]|True"},
  {"conditional_expression", "{{ 'y' if 1 > 2 else 'n' }}|{{ 'y' if false }}|", "n||"},
  {"tests", "{{ x is defined }}{{ none is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is number }}{{ true is boolean }}{{ 3 is odd }}{{ 'a' is equalto 'a' }}{{ [1] is sequence }}{{ false is false }}{{ true is true }}{{ 1 is not none }}{{ x is not defined }}{{ 4 is divisibleby 2 }}",
   "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrue"},
  {"filters", "{{ '  a b  ' | trim }}|{{ 'abc' | length }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ 'hello world' | capitalize }}|{{ 'hello world' | title }}|{{ x | default('dflt') }}|{{ x | d('d') }}|{{ [1,2,3] | join('-') }}|{{ [1,2] | first }}{{ [1,2] | last }}|{{ 'ab' | list }}|{{ 42 | string }}|{{ '12' | int + 1 }}|{{ '1.5' | float }}|{{ 'aXbX' | replace('X', '.') }}|{{ [3,1] | reverse | list }}|{{ [1,2,3] | count }}|{{ 'x' | safe }}|{{ 'z' | int }}|{{ -2 | abs }}",
   "a b|3|AB|ab|Hello world|Hello World|dflt|d|1-2-3|12|['a', 'b']|42|13|1.5|a.b.|[1, 3]|3|x|0|2"},
  {"default_boolean", "{{ '' | default('e', true) }}|{{ '' | default('e') }}|", "e||"},
  {"selectattr_rejectattr_map", "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}|{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}|{{ messages | map(attribute='role') | join(',') }}|{{ ['a', 'b'] | map('upper') | join }}|{{ [0, 1, 2] | select | list }}",
   "[' Hi ']|2|system,user,assistant|AB|[1, 2]"},
  {"tojson_like_json_dumps", "{{ {'a': [1, 2.5, none, true], 'b': 'x\"y\\u00e9\\n'} | tojson }}", "{\"a\": [1, 2.5, null, true], \"b\": \"x\\\"yé\\n\"}"},
  {"tojson_indent", "{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}", "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"},
  {"tojson_sort_keys", "{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}", "{\"a\": 2, \"b\": 1}"},
  {"string_methods", "{{ ' x '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b  c '.split() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x','c')) }}|{{ 'ab'.upper() }}{{ 'AB'.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'aaa'.replace('a','b',2) }}|{{ 'a-b'.split('-', 1) }}|{{ ', '.join(['x', 'y']) }}|{{ 'abc'.find('c') }}",
   "x|axx|xxa|['a', 'b', '', 'c']|['a', 'b', 'c']|TrueTrue|ABab|Hello World|bba|['a', 'b']|x, y|2"},
  {"dict_methods", "{% set d = {'a': 1, 'b': 2} %}{{ d.keys() | list }}{{ d.values() | list }}{{ d.get('a') }}{{ d.get('z', 9) }}{{ d.get('z') }}{{ d['b'] }}{{ d.b }}{{ 'a' in d }}", "['a', 'b'][1, 2]19None22True"},
  {"undefined_like_jinja_default", "{{ x }}|{{ x | length }}|{{ x is defined }}|{{ not x }}|{% for a in x %}a{% endfor %}|{{ messages[0].nope }}|{{ x == x }}|{{ messages[9] is defined }}|{{ x | trim }}|{{ messages[0]['nope'] is defined }}|{{ none.x is defined }}",
   "|0|False|True|||True|False||False|False"},
  {"range_forms", "{{ range(3) | list }}{{ range(1, 10, 3) | list }}{{ range(3, 0, -1) | list }}", "[0, 1, 2][1, 4, 7][3, 2, 1]"},
  {"strftime_now_uses_clock", "{{ strftime_now('%Y-%m-%d') }}", "2024-12-03"},
  {"bos_eos_and_add_generation_prompt", "{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools is none }}{{ documents is none }}", "<s></s>TrueTrueTrue"},
  {"message_attribute_and_item_access", "{{ messages[0]['role'] }}{{ messages[0].role }}{{ messages[-1].content }}", "systemsystemHello!"},
  {"dict_literal_and_nested_access", "{% set d = {'a': {'b': [10, 20]}} %}{{ d.a.b[1] }}{{ d['a']['b'][0] }}", "2010"},
  {"int_float_conversions", "{{ 3.9 | int }}{{ '0x1' | int }}{{ 2 | float }}{{ '  7 ' | int }}", "302.07"},
  {"unique", "{{ [1, 2, 1, 3, 2] | unique | list }}", "[1, 2, 3]"},
  {"differential_findings", "{{ {} | safe | first }}|{{ [x, 1] }}|{{ x is sequence }}|{{ ['a'] is lower }}|{{ 1e3 is divisibleby 2 }}|{{ true is odd }}|{{ true | abs }}",
   "{|[Undefined, 1]|True|True|True|True|1"},
};
// clang-format on

class JinjaCase : public ::testing::TestWithParam<Case> {};

TEST_P(JinjaCase, RendersLikeJinja2) { EXPECT_EQ(render(GetParam().src), GetParam().expected) << GetParam().src; }

INSTANTIATE_TEST_SUITE_P(Language, JinjaCase, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// ---- errors: refused constructs (parse time) and runtime failures, typed and located ------------------------------
struct ErrorCase {
  const char* name;
  const char* src;
  Errc code;
  const char* message;  // the whole message must contain this
};

// clang-format off
const ErrorCase kErrors[] = {
  {"unknown_filter", "{{ x | wordwrap }}", Errc::unsupported, "chat_template:1: unsupported filter 'wordwrap'"},
  {"unknown_filter_line", "a\nb\n\n{{ messages | batch(2) }}", Errc::unsupported, "chat_template:4: unsupported filter 'batch'"},
  {"unknown_test", "{{ 1 is prime }}", Errc::unsupported, "chat_template:1: unsupported test 'prime'"},
  {"include", "{% include 'x.j2' %}", Errc::unsupported, "unsupported statement 'include'"},
  {"extends", "{% extends 'base' %}", Errc::unsupported, "unsupported statement 'extends'"},
  {"import", "{% import 'm' as m %}", Errc::unsupported, "unsupported statement 'import'"},
  {"call_block", "{% call m() %}x{% endcall %}", Errc::unsupported, "unsupported statement 'call'"},
  {"raw_block", "{% raw %}{{ x }}{% endraw %}", Errc::unsupported, "unsupported statement 'raw'"},
  {"recursive_loop", "\n\n{% for x in y recursive %}{% endfor %}", Errc::unsupported, "chat_template:3: unsupported recursive for loop"},
  {"star_args", "{{ f(*a) }}", Errc::unsupported, "unsupported *args"},
  {"string_format_method", "{{ 'x{}'.format(1) }}", Errc::unsupported, "unsupported method 'str.format'"},
  {"list_append_method", "{% set l = [] %}{{ l.append(1) }}", Errc::unsupported, "unsupported method 'list.append'"},
  {"tojson_separators", "{{ 1 | tojson(separators=(',', ':')) }}", Errc::unsupported, "tojson(separators"},
  {"empty_if", "{% if %}x{% endif %}", Errc::format_error, "chat_template:1: expected an expression"},
  {"unterminated_string", "{{ 'abc }}", Errc::format_error, "unterminated string literal"},
  {"missing_endfor", "{% for x in y %}", Errc::format_error, "missing '{% endfor %}'"},
  {"dangling_operator", "{{ 1 + }}", Errc::format_error, "expected an expression"},
  {"stray_endif", "{% endif %}", Errc::format_error, "unknown or misplaced statement 'endif'"},
  {"unclosed_tag", "{{ x ", Errc::format_error, "unclosed '{{' tag"},
  {"unclosed_comment", "{# x", Errc::format_error, "unclosed comment"},
  {"break_outside_loop", "{% break %}", Errc::format_error, "'break' outside a loop"},
  {"bad_character", "{{ 1 @ 2 }}", Errc::format_error, "unexpected character '@'"},
  {"attribute_of_undefined", "{{ x.y }}", Errc::invalid_argument, "chat_template:1: 'x' is undefined"},
  {"item_of_undefined", "{{ messages[0].nope.deeper }}", Errc::invalid_argument, "'nope' is undefined"},
  {"call_of_undefined", "{{ nothing() }}", Errc::invalid_argument, "'nothing' is undefined"},
  {"add_str_and_int", "{{ 'a' + 1 }}", Errc::invalid_argument, "unsupported operand types for +: 'str' and 'int'"},
  {"add_undefined", "{{ 'a' + x }}", Errc::invalid_argument, "'x' is undefined"},
  {"int_of_undefined", "{{ x | int }}", Errc::invalid_argument, "'x' is undefined"},
  {"slice_of_number", "{% set n = 5 %}{{ n[1:] }}", Errc::invalid_argument, "cannot slice 'int'"},
  {"division_by_zero", "{{ 1 // 0 }}", Errc::invalid_argument, "division by zero"},
  {"integer_overflow", "{{ 9223372036854775807 + 1 }}", Errc::invalid_argument, "integer overflow"},
  {"power_overflow", "{{ 10 ** 30 }}", Errc::invalid_argument, "integer overflow"},
  {"raise_exception", "\n{{ raise_exception('Only user and assistant roles are supported!') }}", Errc::invalid_argument,
   "chat_template:2: template raised: Only user and assistant roles are supported!"},
  {"iterate_number", "{% for x in 3 %}{% endfor %}", Errc::invalid_argument, "'int' object is not iterable"},
  {"order_mixed_types", "{{ 1 < 'a' }}", Errc::invalid_argument, "cannot order 'int' and 'str'"},
  {"unpack_mismatch", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", Errc::invalid_argument, "cannot unpack 3 values into 2 names"},
  {"set_attribute_of_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", Errc::invalid_argument, "non-namespace 'd'"},
  {"namespace_cycle", "{% set ns = namespace() %}{% set ns.me = [ns] %}", Errc::unsupported, "namespace inside a namespace"},
};
// clang-format on

class JinjaError : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(JinjaError, IsTypedAndLocated) {
  const ErrorCase& c = GetParam();
  auto r = render_pieces(c.src);
  ASSERT_FALSE(r.ok()) << c.src << " rendered " << flatten(*r);
  EXPECT_EQ(r.error().code, c.code) << r.error().message;
  EXPECT_NE(r.error().message.find(c.message), std::string::npos) << r.error().message;
}

INSTANTIATE_TEST_SUITE_P(Refusals, JinjaError, ::testing::ValuesIn(kErrors),
                         [](const ::testing::TestParamInfo<ErrorCase>& i) { return std::string(i.param.name); });

// ---- trust ---------------------------------------------------------------------------------------------------------
struct TrustCase {
  const char* name;
  const char* src;
  std::vector<RenderedPiece> expected;
};

const TrustCase kTrust[] = {
    {"concatenation_keeps_both_flags", "{{ '<a>' ~ messages[1].content ~ '<b>' }}", {{"<a>", true}, {" Hi ", false}, {"<b>", true}}},
    {"plus_keeps_both_flags", "{{ messages[1].content.strip() + '<|eot_id|>' }}", {{"Hi", false}, {"<|eot_id|>", true}}},
    {"trim_keeps_untrusted", "{{ messages[1].content | trim }}", {{"Hi", false}}},
    {"slice_keeps_untrusted", "{{ messages[2].content[:3] }}", {{"Hel", false}}},
    {"case_change_keeps_untrusted", "{{ messages[1].content | upper }}", {{" HI ", false}}},
    {"replace_inserts_with_its_own_flag", "{{ messages[2].content | replace('!', '<|x|>') }}", {{"Hello", false}, {"<|x|>", true}}},
    {"join_mixes_separator_and_items", "{{ messages | map(attribute='role') | join('<sep>') }}",
     {{"system", false}, {"<sep>", true}, {"user", false}, {"<sep>", true}, {"assistant", false}}},
    {"tojson_of_untrusted_data", "{{ messages[1] | tojson }}",
     {{"{\"role\": \"", true}, {"user", false}, {"\", \"content\": \"", true}, {" Hi ", false}, {"\"}", true}}},
    {"numbers_are_trusted", "{{ messages | length }}", {{"3", true}}},
    {"macro_output_keeps_flags", "{% macro m(x) %}[{{ x }}]{% endmacro %}{{ m(messages[0].content) }}", {{"[", true}, {"Be brief.", false}, {"]", true}}},
    {"block_set_keeps_flags", "{% set s %}<{{ messages[0].role }}>{% endset %}{{ s }}", {{"<", true}, {"system", false}, {">", true}}},
    {"split_keeps_flags", "{{ (messages[2].content ~ '|x').split('|')[1] }}", {{"x", true}}},
    {"repr_of_list_marks_items", "{{ [messages[0].role] }}", {{"['", true}, {"system", false}, {"']", true}}},
    {"template_literals_are_trusted", "<|im_start|>{{ '<|im_end|>' }}", {{"<|im_start|><|im_end|>", true}}},
    {"filter_block_keeps_flags", "{% filter lower %}A{{ messages[1].content }}{% endfilter %}", {{"a", true}, {" hi ", false}}},
};

class JinjaTrust : public ::testing::TestWithParam<TrustCase> {};

TEST_P(JinjaTrust, FlagsSurvive) {
  auto r = render_pieces(GetParam().src);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(*r, GetParam().expected);
}

INSTANTIATE_TEST_SUITE_P(Trust, JinjaTrust, ::testing::ValuesIn(kTrust),
                         [](const ::testing::TestParamInfo<TrustCase>& i) { return std::string(i.param.name); });

// ---- limits: hostile templates end quickly with a typed error ------------------------------------------------------
std::string repeat(std::string_view s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

struct LimitCase {
  const char* name;
  std::string src;
  Errc code;
  const char* message;
};

TEST(JinjaLimits, HostileTemplatesFailFastWithTypedErrors) {
  const LimitCase cases[] = {
      {"deep_blocks", repeat("{% if true %}", 100) + "x" + repeat("{% endif %}", 100), Errc::unsupported, "nested too deeply"},
      {"deep_parentheses", "{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}", Errc::unsupported, "nested too deeply"},
      {"deep_lists", "{{ " + repeat("[", 5000) + repeat("]", 5000) + " }}", Errc::unsupported, "nested too deeply"},
      {"deep_not", "{{ " + repeat("not ", 5000) + "1 }}", Errc::unsupported, "nested too deeply"},
      {"deep_filters", "{{ 1" + repeat("|string", 5000) + " }}", Errc::unsupported, "nested too deeply"},
      {"huge_range", "{% for i in range(10**9) %}x{% endfor %}", Errc::invalid_argument, "range() longer than"},
      {"nested_loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", Errc::invalid_argument, "evaluation budget"},
      {"output_size", "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", Errc::invalid_argument, "output exceeds"},
      {"string_repetition", "{{ 'x' * 10**9 }}", Errc::invalid_argument, "repetition exceeds"},
      {"string_doubling", "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", Errc::invalid_argument, "output limit"},
      {"list_doubling", "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", Errc::invalid_argument, "list too long"},
      {"value_nesting", "{% set ns = namespace(v=[]) %}{% for i in range(1000) %}{% set ns.v = [ns.v] %}{% endfor %}", Errc::invalid_argument, "nested deeper than"},
      {"macro_recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", Errc::invalid_argument, "macro calls nested too deeply"},
      {"macro_fanout", "{% macro f(n) %}{% if n < 30 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}", Errc::invalid_argument, "evaluation budget"},
      {"huge_split", "{{ ('x,' * 500000).split(',') | length }}", Errc::invalid_argument, "split: too many parts"},
  };
  for (const auto& c : cases) {
    auto start = std::chrono::steady_clock::now();
    auto r = render_pieces(c.src);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.error().code, c.code) << c.name << ": " << r.error().message;
    EXPECT_NE(r.error().message.find(c.message), std::string::npos) << c.name << ": " << r.error().message;
    EXPECT_LT(secs, 30.0) << c.name;  // a hang guard: about 1 s at most in a release build, ~10x that under ASan
    std::printf("  %-18s %.3f s\n", c.name, secs);
  }
}

TEST(JinjaLimits, OutputLimitIsExact) {
  auto ok = render_pieces("{{ 'x' * 10 }}", 10);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(flatten(*ok), "xxxxxxxxxx");
  EXPECT_FALSE(render_pieces("{{ 'x' * 10 }}!", 10).ok());
}

// ---- randomized robustness: thousands of mutations of the real templates never crash --------------------------------
TEST(JinjaRobustness, MutatedFamilyTemplatesNeverCrash) {
  static const char* const kTokens[] = {"{%", "%}", "{{", "}}", "{#", "#}", "-%}", "{%-", "(", ")", "[", "]", "'", "\"",
                                        "|", ".", ",", ":", "~", "*", "**", "//", "-", "+", "not ", " in ", " is ",
                                        " if ", " else ", "for x in messages", "endfor", "endif", "loop.index",
                                        "range(99999)", "namespace(a=1)", "raise_exception('m')", "tojson", "trim",
                                        "messages[0]", "[::-1]", "\\", "\n", "  ", "none", "ns.found", "{% break %}",
                                        "{% set x = x ~ x %}", "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"};
  std::mt19937 rng(20261203);
  std::size_t rendered = 0, refused = 0;
  for (const auto& f : testdata::kFamilyTemplates) {
    for (int iter = 0; iter < 400; ++iter) {
      std::string src(f.source);
      int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !src.empty(); ++e) {
        std::size_t at = rng() % src.size();
        switch (rng() % 4) {
          case 0: src.erase(at, 1 + rng() % 8); break;
          case 1: src.insert(at, kTokens[rng() % std::size(kTokens)]); break;
          case 2: src.insert(at, src.substr(rng() % src.size(), 1 + rng() % 40)); break;
          default: src[at] = static_cast<char>(rng() % 256); break;
        }
      }
      auto tpl = ChatTemplate::parse(src);
      if (!tpl.ok()) {
        EXPECT_NE(tpl.error().code, Errc::internal) << tpl.error().message;
        ++refused;
        continue;
      }
      ChatTemplateOptions o;
      o.bos_token = "<s>";
      o.max_output_bytes = 1 << 16;
      o.clock = [] { return std::time_t{0}; };
      auto out = tpl->render(kConversation, o);
      if (out.ok()) {
        EXPECT_LE(flatten(*out).size(), o.max_output_bytes);
        ++rendered;
      } else {
        EXPECT_NE(out.error().code, Errc::internal) << out.error().message;
        ++refused;
      }
    }
  }
  EXPECT_EQ(rendered + refused, std::size(testdata::kFamilyTemplates) * 400);
  EXPECT_GT(rendered, 0u);
  EXPECT_GT(refused, 0u);
}

}  // namespace
}  // namespace tandem::gen
