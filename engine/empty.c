/* empty.c — stands in for a module folder that has no sources yet. */
typedef int tpi_empty_translation_unit;
