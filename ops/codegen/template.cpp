#include "ops/codegen/template.h"

#include <set>
#include <stdexcept>

namespace cl {
namespace codegen {

namespace {

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

std::string_view drop_leading_newline(std::string_view t) {
  if (!t.empty() && t.front() == '\n') t.remove_prefix(1);
  return t;
}

std::string fill_text(std::string_view text, const Slots& slots) {
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  std::set<std::string_view> used;
  size_t i = 0;
  while (i < text.size()) {
    const size_t at = text.find("${", i);
    if (at == std::string_view::npos) {
      out.append(text.substr(i));
      break;
    }
    out.append(text.substr(i, at - i));
    size_t end = at + 2;
    while (end < text.size() && name_char(text[end])) ++end;
    if (end == at + 2 || end >= text.size() || text[end] != '}')
      throw std::invalid_argument("template: a malformed slot at offset " + std::to_string(at) +
                                  ": " + std::string(text.substr(at, 40)));
    const std::string_view name = text.substr(at + 2, end - at - 2);
    const auto v = slots.find(name);
    if (v == slots.end())
      throw std::invalid_argument("template: no value for slot ${" + std::string(name) + "}");
    used.insert(v->first);
    i = end + 1;
    const bool line_start = at == 0 || text[at - 1] == '\n';
    if (line_start && i < text.size() && text[i] == '\n') {  // a whole-line slot
      if (!v->second.empty() && v->second.back() != '\n')
        throw std::invalid_argument("template: slot ${" + std::string(name) +
                                    "} stands for lines, its value does not end in a newline");
      ++i;
    }
    out.append(v->second);
  }
  for (const auto& kv : slots)
    if (!used.count(kv.first))
      throw std::invalid_argument("template: the value of ${" + kv.first + "} fills no slot");
  return out;
}

}  // namespace

std::string fill(std::string_view text, const Slots& slots) {
  return fill_text(drop_leading_newline(text), slots);
}

std::string fill_joined(std::initializer_list<std::string_view> texts, const Slots& slots) {
  std::string all;
  for (std::string_view t : texts) all.append(drop_leading_newline(t));
  return fill_text(all, slots);
}

}  // namespace codegen
}  // namespace cl
