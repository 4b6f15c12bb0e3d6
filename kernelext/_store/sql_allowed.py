"""What a query on the read-only SQL surface may call: an allow-list, family by family.

``sql_guard`` admits a function only if its name (lower case, as DuckDB's parser writes it
in ``json_serialize_sql``) is listed here for the place it is called from; everything else
is refused, including every function a future DuckDB or an extension adds. Each family was
reviewed against ``duckdb_functions()`` (``tests/store/test_sql_allowlist.py`` proves, on the
installed DuckDB, that nothing listed runs SQL, writes, reads files, advances a sequence or
changes a setting, and that every macro listed expands only to listed calls).

Operators are functions in the syntax tree (``~~`` is LIKE, ``->>`` is JSON extraction,
``list_value`` is ``[…]``, ``struct_pack`` is ``{…}``); CASE, CAST, COALESCE, IN, BETWEEN,
IS NULL, subscripts and lambdas are expression classes (``EXPRESSIONS``).
"""

from __future__ import annotations

__all__ = [
    "AGGREGATES",
    "AGGREGATE_NAME_ARGUMENT",
    "EXPRESSIONS",
    "FILE_READERS",
    "FUNCTIONS",
    "MODIFIERS",
    "REFUSED_VIEWS",
    "TABLE_FUNCTIONS",
    "TABLE_REFS",
    "WINDOW_FUNCTIONS",
    "allowed_function",
    "allowed_table_function",
]


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# -- scalar functions, aggregates and macros (called as f(...) in an expression) ------------
# family: (why it is harmless, names)
SCALAR_FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "operators": (
        "arithmetic, comparison, bit, string, list and pattern operators: pure",
        _names(
            """!= !~~ !~~* % & && * ** + - ->> / // < <-> << <= <=> <@ = > >= >> @ @> ^ ^@ | || ~
            ~~ ~~* ~~~ add subtract multiply divide mod xor fdiv"""
        ),
    ),
    "math": (
        "numbers in, numbers out",
        _names(
            """abs acos acosh asin asinh atan atan2 atanh bit_count cbrt ceil ceiling cos cosh cot
            degrees even exp factorial floor fmod gamma gcd greatest greatest_common_divisor
            isfinite isinf isnan lcm least least_common_multiple lgamma ln log log10 log2
            nextafter pi pow power radians round round_even roundbankers sign signbit sin sinh
            sqrt tan tanh trunc decimal_division equi_width_bins bar random gen_random_uuid uuid
            uuidv4 uuidv7 uuid_extract_timestamp uuid_extract_version binom"""
        ),
    ),
    "strings": (
        "text in, text out (no path is opened: parse_path and friends only split strings)",
        _names(
            """ascii bin bit_length bit_position bitstring bitstring_byte_comparable char_length
            character_length chr concat concat_ws contains damerau_levenshtein decode editdist3
            encode ends_with format format_bytes formatreadabledecimalsize formatreadablesize
            from_base64 from_binary from_hex get_bit hamming hash hex ilike_escape instr jaccard
            jaro_similarity jaro_winkler_similarity lcase left left_grapheme len length
            length_grapheme levenshtein like_escape lower lpad ltrim md5 md5_number mismatches
            nfc_normalize not_ilike_escape not_like_escape octet_length ord overlay
            parse_dirname parse_dirpath parse_filename parse_formatted_bytes parse_path
            path_join position prefix printf repeat replace reverse right right_grapheme rpad
            rtrim set_bit sha1 sha256 split split_part starts_with strip_accents strlen strpos
            str_split str_split_regex string_split string_split_regex string_to_array substr
            substring substring_grapheme suffix to_base to_base64 to_binary to_hex translate
            trim ucase unbin unhex unicode upper url_decode url_encode base64 array_to_string
            array_to_string_comma_default md5_number_lower md5_number_upper
            hive_partition_component"""
        ),
    ),
    "regexp": (
        "regular expressions over values",
        _names(
            """regexp_escape regexp_extract regexp_extract_all regexp_full_match regexp_matches
            regexp_replace regexp_split_to_array"""
        ),
    ),
    "dates": (
        "dates, times, intervals and time zones (now() is the transaction's start)",
        _names(
            """age ago century current_date current_localtime current_localtimestamp date_add
            date_diff date_part date_sub date_trunc datediff datepart datesub datetrunc day
            dayname dayofmonth dayofweek dayofyear days_in_month decade epoch epoch_ms epoch_ns
            epoch_us era get_current_time get_current_timestamp hour isodow isoyear julian
            last_day make_date make_time make_timestamp make_timestamp_ms make_timestamp_ns
            make_timestamptz microsecond millennium millisecond minute month monthname
            nanosecond normalized_interval now quarter second strftime strptime time_bucket
            timetz_byte_comparable timezone timezone_hour timezone_minute to_centuries to_days
            to_decades to_hours to_microseconds to_millennia to_milliseconds to_minutes
            to_months to_quarters to_seconds to_timestamp to_weeks to_years today
            transaction_timestamp try_strptime week weekday weekofyear year yearweek
            pg_conf_load_time pg_postmaster_start_time"""
        ),
    ),
    "lists, structs, maps, unions": (
        "nested values built and taken apart; lambdas are checked like any expression",
        _names(
            """apply array_append array_apply array_cat array_concat array_contains
            array_cosine_distance array_cosine_similarity array_cross_product array_distance
            array_distinct array_dot_product array_extract array_filter array_grade_up array_has
            array_has_all array_has_any array_indexof array_inner_product array_intersect
            array_length array_negative_dot_product array_negative_inner_product array_pop_back
            array_pop_front array_position array_prepend array_push_back array_push_front
            array_reduce array_resize array_reverse array_reverse_sort array_select array_slice
            array_sort array_transform array_unique array_value array_where array_zip
            cardinality element_at filter flatten generate_series generate_subscripts grade_up
            invoke list_any_value list_append list_apply list_approx_count_distinct list_avg
            list_bit_and list_bit_or list_bit_xor list_bool_and list_bool_or list_cat
            list_concat list_contains list_cosine_distance list_cosine_similarity list_count
            list_distance list_distinct list_dot_product list_element list_entropy list_extract
            list_filter list_first list_grade_up list_has list_has_all list_has_any
            list_histogram list_indexof list_inner_product list_intersect list_kurtosis
            list_kurtosis_pop list_last list_mad list_max list_median list_min list_mode
            list_negative_dot_product list_negative_inner_product list_pack list_position
            list_prepend list_product list_reduce list_resize list_reverse list_reverse_sort
            list_select list_sem list_skewness list_slice list_sort list_stddev_pop
            list_stddev_samp list_string_agg list_sum list_transform list_unique list_value
            list_var_pop list_var_samp list_where list_zip map map_concat map_contains
            map_contains_entry map_contains_value map_entries map_extract map_extract_value
            map_from_entries map_keys map_values range reduce unnest regexp_split_to_table
            remap_struct row struct_concat struct_contains struct_extract struct_extract_at
            struct_has struct_indexof struct_insert struct_keys struct_pack struct_position
            struct_update struct_values union_extract union_tag union_value unpivot_list
            enum_code enum_first enum_last enum_range enum_range_boundary"""
        ),
    ),
    "list aggregates by name": (
        "run an aggregate over a list; the aggregate's name must be a listed aggregate, "
        "written as a constant (see AGGREGATE_NAME_ARGUMENT)",
        _names("aggregate array_aggr array_aggregate list_aggr list_aggregate"),
    ),
    "json": (
        "JSON values read, built and reshaped in memory (no file, no SQL text)",
        _names(
            """array_to_json from_json from_json_strict json json_array json_array_length
            json_contains json_deep_merge json_exists json_extract json_extract_path
            json_extract_path_text json_extract_string json_insert json_keys json_merge_patch
            json_merge_patch_diff json_normalize json_object json_pretty json_quote json_remove
            json_replace json_set json_strip_nulls json_structure json_transform
            json_transform_strict json_type json_valid json_value row_to_json to_json
            json_group_array json_group_object json_group_structure"""
        ),
    ),
    "variants and geometry": (
        "VARIANT and GEOMETRY values converted in memory",
        _names(
            """variant_array_length variant_comparator variant_contains variant_exists
            variant_extract variant_extract_string variant_keys variant_normalize variant_type
            variant_typeof variant_group_array st_asbinary st_asgeojson st_astext st_aswkb
            st_aswkt st_crs st_geomfromgeojson st_geomfromwkb st_intersects_extent st_setcrs
            vertex_extract"""
        ),
    ),
    "types and values": (
        "about a value or its type; error() only fails the query",
        _names(
            """alias can_cast_implicitly cast_to_type constant_or_null create_sort_key error
            get_type if is_histogram_other_bin make_type nullif replace_type stats switch typeof
            pg_typeof vector_type assert_true combine finalize to_aggregate_state format_pg_type
            format_type map_to_pg_oid map_type_id_to_pg_oid"""
        ),
    ),
    "session, read only": (
        "read who and where the query runs; none changes anything",
        _names(
            """current_catalog current_connection_id current_database current_query
            current_query_id current_role current_schema current_schemas current_setting
            current_transaction_id current_user getvariable in_search_path session_user user
            version get_block_size pg_size_pretty"""
        ),
    ),
    "PostgreSQL compatibility": (
        "constant answers DuckDB gives to PostgreSQL's catalogue helpers, or catalogue reads",
        _names(
            """col_description obj_description shobj_description has_any_column_privilege
            has_column_privilege has_database_privilege has_foreign_data_wrapper_privilege
            has_function_privilege has_language_privilege has_schema_privilege
            has_sequence_privilege has_server_privilege has_table_privilege
            has_tablespace_privilege inet_client_addr inet_client_port inet_server_addr
            inet_server_port pg_collation_is_visible pg_conversion_is_visible
            pg_function_is_visible pg_get_constraintdef pg_get_expr pg_get_viewdef pg_has_role
            pg_is_other_temp_schema pg_my_temp_schema pg_opclass_is_visible
            pg_operator_is_visible pg_opfamily_is_visible pg_table_is_visible
            pg_ts_config_is_visible pg_ts_dict_is_visible pg_ts_parser_is_visible
            pg_ts_template_is_visible pg_type_is_visible"""
        ),
    ),
}

AGGREGATE_FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "aggregates": (
        "fold rows into a value (approximate and quantile ones included)",
        _names(
            """any_value approx_count_distinct approx_quantile approx_top_k arbitrary arg_max
            arg_max_null arg_max_nulls_last arg_min arg_min_null arg_min_nulls_last argmax
            argmin array_agg avg bit_and bit_or bit_xor bitstring_agg bool_and bool_or
            combine_aggr corr count count_if count_star countif covar_pop covar_samp
            decimal_average entropy favg first fsum geomean geometric_mean group_concat
            histogram histogram_exact kahan_sum kurtosis kurtosis_pop last list listagg lttb mad
            max max_by mean median min min_by mode product quantile quantile_cont quantile_disc
            regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy
            regr_syy reservoir_quantile sem skewness stddev stddev_pop stddev_samp string_agg
            sum sum_no_overflow sumkahan var_pop var_samp variance variant_group_object wavg
            weighted_avg"""
        ),
    ),
}
WINDOW_FUNCTIONS = _names(
    """cume_dist dense_rank fill first_value lag last_value lead nth_value ntile percent_rank rank
    rank_dense row_number"""
)  # window-only functions; any listed aggregate works OVER (...) too

# -- table functions (FROM f(...)) ------------------------------------------------------------
TABLE_FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "catalogue": (
        "read the database's own catalogue and settings (nothing that lists secrets, logs "
        "or the extension folder)",
        _names(
            """duckdb_columns duckdb_constraints duckdb_databases duckdb_dependencies
            duckdb_functions duckdb_indexes duckdb_keywords duckdb_schemas duckdb_sequences
            duckdb_settings duckdb_tables duckdb_types duckdb_views duckdb_memory
            duckdb_optimizers duckdb_temporary_files duckdb_variables duckdb_triggers
            duckdb_coordinate_systems duckdb_profiling_settings duckdb_prepared_statements
            pragma_table_info pragma_show pragma_version pragma_platform pragma_database_size
            pragma_storage_info pragma_metadata_info pragma_collations pragma_user_agent
            icu_calendar_names pg_timezone_names"""
        ),
    ),
    "generators": (
        "rows made from the arguments",
        _names("range generate_series unnest repeat repeat_row json_each json_tree"),
    ),
}
FILE_READERS = _names(
    """read_csv read_csv_auto read_json read_json_auto read_json_objects read_json_objects_auto
    read_ndjson read_ndjson_auto read_ndjson_objects read_parquet parquet_scan parquet_metadata
    parquet_schema parquet_file_metadata parquet_kv_metadata parquet_full_metadata
    parquet_bloom_probe parquet_page_index read_text read_blob glob sniff_csv"""
)  # read files outside the store: only with allow_files (never on PostgreSQL)

FUNCTIONS: frozenset[str] = frozenset().union(
    *(names for _, names in SCALAR_FAMILIES.values()),
    *(names for _, names in AGGREGATE_FAMILIES.values()),
)
AGGREGATES: frozenset[str] = frozenset().union(*(n for _, n in AGGREGATE_FAMILIES.values()))
TABLE_FUNCTIONS: frozenset[str] = frozenset().union(*(n for _, n in TABLE_FAMILIES.values()))
# list_aggregate(l, 'name'): which argument names an aggregate (it must be a listed one).
AGGREGATE_NAME_ARGUMENT = {name: 1 for name in SCALAR_FAMILIES["list aggregates by name"][1]}

# -- the shapes of a query ---------------------------------------------------------------------
# Expression classes of the syntax tree: FUNCTION and WINDOW are checked by name above.
EXPRESSIONS = _names(
    """BETWEEN CASE CAST COLLATE COLUMN_REF COMPARISON CONJUNCTION CONSTANT DEFAULT FUNCTION LAMBDA
    LAMBDA_REF OPERATOR PARAMETER POSITIONAL_REFERENCE STAR SUBQUERY TYPE WINDOW"""
)
# What may stand in FROM: tables, joins, subqueries, VALUES, PIVOT/UNPIVOT, DESCRIBE/SHOW.
TABLE_REFS = _names("BASE_TABLE EMPTY EXPRESSION_LIST JOIN PIVOT SHOW_REF SUBQUERY TABLE_FUNCTION")
MODIFIERS = _names("DISTINCT_MODIFIER LIMIT_MODIFIER LIMIT_PERCENT_MODIFIER ORDER_MODIFIER")
# Views of the system catalogue that read what a refused table function reads.
REFUSED_VIEWS = _names("duckdb_logs")


def allowed_function(name: str, *, window: bool = False) -> bool:
    """May ``name`` be called in an expression (``window``: as ``name(...) OVER (...)``)?"""
    name = name.lower()
    if window:
        return name in WINDOW_FUNCTIONS or name in AGGREGATES
    return name in FUNCTIONS


def allowed_table_function(name: str, *, allow_files: bool) -> bool:
    """May ``name`` stand in FROM as ``name(...)``?"""
    name = name.lower()
    return name in TABLE_FUNCTIONS or (allow_files and name in FILE_READERS)
