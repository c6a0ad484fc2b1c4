/*
 * json_py.h — JSON text read without a tree and written again as Python writes it.
 *
 * Chat templates print tool definitions and tool-call arguments with Hugging Face's
 * `tojson` filter, which is Python's json.dumps(value, ensure_ascii=False) of what
 * json.loads made of the request: ", " and ": " separators, keys in their order, every
 * non-ASCII character as itself, 1.0 kept a float and 1 an int, floats in Python's
 * shortest repr. A parsed tree (cJSON) has lost the int/float difference, so these
 * functions work on the text itself: they find a member's value in an object, and print
 * a value the Python way. Everything is bounded by [b, e): no NUL terminator is needed.
 * A repeated key is printed as Python's dict keeps it: at its first place, with its last
 * value.
 */
#ifndef JSON_PY_H
#define JSON_PY_H

#include <stdbool.h>
#include <stddef.h>

/* Where the JSON value starting at the first non-space of [p, e) ends (one past it), or
 * NULL when it is not one valid value. Nesting deeper than 512 is refused; a string with
 * \u0000 is valid here (the functions that decode or print strings refuse it). */
const char *json_value_end(const char *p, const char *e);

/* In the JSON object whose text is [b, e) (spaces around it allowed), the value of the
 * member named `key` (escapes in the text decoded before comparing): true with [*vb, *ve)
 * its text; false when there is no such member or [b, e) is not an object. With a
 * repeated key, the last (Python's json.loads keeps the last value). */
bool json_member(const char *b, const char *e, const char *key, const char **vb, const char **ve);

/* The elements of the JSON array [b, e), in one pass: the first `max` of their texts into
 * [vb[i], ve[i]) (vb, ve may be NULL when max is 0); returns how many there are (all of
 * them, past max too), or -1 when [b, e) is not an array. */
int json_items(const char *b, const char *e, const char **vb, const char **ve, int max);

/* The first member name of the JSON object [b, e) that is none of `names` (a NULL-ended
 * list), decoded and malloc'd; NULL when every name is one of them. */
char *json_other_member(const char *b, const char *e, const char *const *names);

/* Whether [b, e) (spaces around it allowed) is one JSON value of this kind. */
bool json_is_object(const char *b, const char *e);
bool json_is_string(const char *b, const char *e);
bool json_is_null(const char *b, const char *e);

/* The JSON string [b, e) decoded to UTF-8 in a malloc'd, NUL-terminated copy; NULL when it
 * is not a valid string, holds a lone surrogate or a NUL, or memory ran out. */
char *json_string_value(const char *b, const char *e);

/* Python's json.dumps(json.loads(text), ensure_ascii=False) of the JSON value [b, e),
 * malloc'd and NUL-terminated; NULL with *why set (a static message) when the text is
 * not one valid value, has a string with a lone surrogate or a NUL, or memory ran out. */
char *json_py_dumps(const char *b, const char *e, const char **why);

/* A growing string the printers append to; `failed` once an allocation failed. */
struct json_buf {
    char *p;
    size_t n, cap;
    bool failed;
};

/* Append [s, s + n) to b. */
void json_buf_put(struct json_buf *b, const char *s, size_t n);

/* Append Python's json.dumps form of the UTF-8 string s (a quoted, escaped literal). */
void json_py_put_string(struct json_buf *b, const char *s);

/* Append a double as Python's repr writes it (the shortest digits that read back as v,
 * positional for decimal exponents -4..15: 1000000.0, 1e-06; inf as Infinity). */
void json_py_put_float(struct json_buf *b, double v);

/* Append Python's json.dumps form of the JSON value [vb, ve); false with *why when it
 * cannot be printed so (as json_py_dumps). */
bool json_py_put(struct json_buf *b, const char *vb, const char *ve, const char **why);

/* Whether the JSON text [s, s + n) has a string with a \u0000 escape: cJSON's strings end
 * at a NUL, so the text after it would be lost without a word. */
bool json_text_holds_nul(const char *s, size_t n);

#endif /* JSON_PY_H */
