// The little of JSON that model.json needs: objects, arrays, strings (with \u escapes), numbers, true/false/null.
#pragma once

#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object } type = Type::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool is_null() const { return type == Type::Null; }
  bool has(const std::string& key) const { return type == Type::Object && object.count(key) && !object.at(key).is_null(); }
  const Json& operator[](const std::string& key) const {
    if (!has(key)) throw std::runtime_error("model.json lacks \"" + key + "\"");
    return object.at(key);
  }
  const Json& operator[](size_t i) const { return array.at(i); }
  double num() const {
    if (type != Type::Number) throw std::runtime_error("model.json: expected a number");
    return number;
  }
  const std::string& str() const {
    if (type != Type::String) throw std::runtime_error("model.json: expected a string");
    return string;
  }

  static Json parse(const std::string& text) {
    size_t at = 0;
    Json value = parse_value(text, at);
    skip_space(text, at);
    if (at != text.size()) error(at);
    return value;
  }

 private:
  [[noreturn]] static void error(size_t at) {
    throw std::runtime_error("model.json is not valid JSON (at byte " + std::to_string(at) + ")");
  }
  static void skip_space(const std::string& s, size_t& at) {
    while (at < s.size() && (s[at] == ' ' || s[at] == '\n' || s[at] == '\r' || s[at] == '\t')) ++at;
  }
  static void expect(const std::string& s, size_t& at, const char* word) {
    for (const char* c = word; *c; ++c, ++at) {
      if (at >= s.size() || s[at] != *c) error(at);
    }
  }
  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }
  static unsigned hex4(const std::string& s, size_t& at) {
    if (at + 4 > s.size()) error(at);
    char* end = nullptr;
    const std::string digits = s.substr(at, 4);
    const unsigned code = static_cast<unsigned>(std::strtoul(digits.c_str(), &end, 16));
    if (end != digits.c_str() + 4) error(at);
    at += 4;
    return code;
  }
  static std::string parse_string(const std::string& s, size_t& at) {
    std::string out;
    ++at;  // the opening quote
    while (at < s.size() && s[at] != '"') {
      char c = s[at++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at >= s.size()) error(at);
      switch (char e = s[at++]) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          unsigned code = hex4(s, at);
          if (code >= 0xD800 && code < 0xDC00 && at + 1 < s.size() && s[at] == '\\' && s[at + 1] == 'u') {
            at += 2;  // a surrogate pair: one code point above U+FFFF
            code = 0x10000 + ((code - 0xD800) << 10) + (hex4(s, at) - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default: out += e;  // \" \\ \/
      }
    }
    if (at >= s.size()) error(at);
    ++at;  // the closing quote
    return out;
  }
  static Json parse_value(const std::string& s, size_t& at) {
    skip_space(s, at);
    if (at >= s.size()) error(at);
    Json v;
    const char c = s[at];
    if (c == '{') {
      v.type = Type::Object;
      ++at;
      skip_space(s, at);
      if (at < s.size() && s[at] == '}') return ++at, v;
      while (true) {
        skip_space(s, at);
        if (at >= s.size() || s[at] != '"') error(at);
        std::string key = parse_string(s, at);
        skip_space(s, at);
        expect(s, at, ":");
        v.object[key] = parse_value(s, at);
        skip_space(s, at);
        if (at < s.size() && s[at] == ',') { ++at; continue; }
        expect(s, at, "}");
        return v;
      }
    }
    if (c == '[') {
      v.type = Type::Array;
      ++at;
      skip_space(s, at);
      if (at < s.size() && s[at] == ']') return ++at, v;
      while (true) {
        v.array.push_back(parse_value(s, at));
        skip_space(s, at);
        if (at < s.size() && s[at] == ',') { ++at; continue; }
        expect(s, at, "]");
        return v;
      }
    }
    if (c == '"') {
      v.type = Type::String;
      v.string = parse_string(s, at);
      return v;
    }
    if (c == 't') { expect(s, at, "true"); v.type = Type::Bool; v.boolean = true; return v; }
    if (c == 'f') { expect(s, at, "false"); v.type = Type::Bool; return v; }
    if (c == 'n') { expect(s, at, "null"); return v; }
    char* end = nullptr;
    v.number = std::strtod(s.c_str() + at, &end);  // also NaN/Infinity, which Python's json writes
    if (end == s.c_str() + at) error(at);
    at = static_cast<size_t>(end - s.c_str());
    v.type = Type::Number;
    return v;
  }
};
