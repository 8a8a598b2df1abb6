// Kernel sources as templates with named slots (issue 51): the text of a kernel, written
// out as it is generated, with `${name}` where a value computed by the generator goes.
//
//   fill(R"(
//   for (int c = 0; c < ${nc}; ++c) {
//   ${body}
//   })", {{"nc", "4"}, {"body", lines}});
//
// - A slot's name is letters, digits and underscores; a `$` not followed by `{` is text.
// - A slot alone on a line stands for whole lines: its value (empty, or lines each ending
//   in a newline) replaces the line, newline included. Anywhere else the value is
//   inserted as it is.
// - A text that starts with a newline (a raw string literal opened on its own line) drops
//   that newline.
// - A slot of the text without a value, or a value that fills no slot, throws
//   std::invalid_argument naming it (so a template and its generator cannot drift apart
//   silently); so does a whole-line slot given a value that does not end in a newline.
#pragma once
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>

namespace cl {
namespace codegen {

using Slots = std::map<std::string, std::string, std::less<>>;

std::string fill(std::string_view text, const Slots& slots);
// The texts one after the other (each dropping its leading newline) filled as one text:
// every slot of any of them needs a value, and every value must fill a slot of one.
std::string fill_joined(std::initializer_list<std::string_view> texts, const Slots& slots);

}  // namespace codegen
}  // namespace cl
