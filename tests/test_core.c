/*
 * test_core.c — the basics every module uses: error records, f16/bf16 conversion
 * against exact reference values, and JSON read as Python reads it.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "tpi.h"

START_TEST(test_error_wrap) {
    struct tpi_error e;
    tpi_err_clear(&e);
    ck_assert_int_eq(tpi_err(&e, TPI_ERR_FORMAT, "key '%s' missing", "x"), TPI_ERR_FORMAT);
    tpi_err_wrap(&e, "%s", "model.gguf");
    ck_assert_str_eq(e.msg, "model.gguf: key 'x' missing");
    ck_assert_str_eq(tpi_status_name(e.status), "format");
}
END_TEST

START_TEST(test_half_conversions) {
    /* exact values: 1.0, -2.0, 65504 (max), 2^-24 (min subnormal), 0.1 rounded */
    ck_assert_uint_eq(tpi_f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(tpi_f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(tpi_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(tpi_f32_to_f16(5.9604645e-8f), 0x0001);
    ck_assert_uint_eq(tpi_f32_to_f16(0.1f), 0x2e66);
    ck_assert_uint_eq(tpi_f32_to_f16(1e6f), 0x7c00);
    for (uint32_t h = 0; h < 0x7c00; h++) { /* every finite positive half round-trips */
        float f = tpi_f16_to_f32((uint16_t)h);
        ck_assert_uint_eq(tpi_f32_to_f16(f), h);
    }
    ck_assert_float_eq(tpi_bf16_to_f32(0x3f80), 1.0f);
    ck_assert_uint_eq(tpi_f32_to_bf16(1.00390625f), 0x3f80); /* tie rounds to even */
    ck_assert_uint_eq(tpi_f32_to_bf16(1.01171875f), 0x3f82); /* tie rounds to even, up */
}
END_TEST

/* tpi_json_parse reads a repeated key as Python's json.loads does: the first place, the
 * last value (at any depth); and nothing may follow the value. */
START_TEST(test_json_parse) {
    const char *text = "{\"a\": 1, \"b\": [{\"c\": 1, \"d\": 0, \"c\": 2, \"c\": 3}], \"a\": "
                       "{\"x\": true}} ";
    cJSON *j = tpi_json_parse(text, strlen(text));
    ck_assert_ptr_nonnull(j);
    char *out = cJSON_PrintUnformatted(j);
    ck_assert_str_eq(out, "{\"a\":{\"x\":true},\"b\":[{\"c\":3,\"d\":0}]}");
    free(out);
    cJSON_Delete(j);
    const char *bad[] = {"{\"a\": 1} x", "[1,]", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_ptr_null(tpi_json_parse(bad[i], strlen(bad[i])));
}
END_TEST

int main(void) {
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_error_wrap);
    tcase_add_test(tc, test_half_conversions);
    tcase_add_test(tc, test_json_parse);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
