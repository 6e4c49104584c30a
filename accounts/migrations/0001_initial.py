# The key, token and user-budget models move here from the `ocxsite` app (issue #25). Their
# tables stay where they are (`db_table` keeps the old names): this migration only tells
# Django's state that `accounts` owns them, and carries the content types over (so the
# permissions granted on them and the admin's history stay attached). A fresh database gets
# the tables from `ocxsite` 0001/0002, which run first.

import django.db.models.deletion
import usage.budgets
from django.conf import settings
from django.db import migrations, models

MODELS = ("clientkey", "managementtoken", "userbudget")


def _move_content_types(apps, schema_editor, old, new):
    content_type = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    for model in MODELS:
        if not content_type.objects.using(db).filter(app_label=new, model=model).exists():
            content_type.objects.using(db).filter(app_label=old, model=model).update(app_label=new)


def forwards(apps, schema_editor):
    _move_content_types(apps, schema_editor, "ocxsite", "accounts")


def backwards(apps, schema_editor):
    _move_content_types(apps, schema_editor, "accounts", "ocxsite")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('ocxsite', '0002_budgets'),
        ('contenttypes', '0002_remove_content_type_name'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ClientKey',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(blank=True, default='', max_length=64)),
                        ('prefix', models.CharField(help_text='first characters, to recognise a key', max_length=16)),
                        ('digest', models.CharField(max_length=64, unique=True)),
                        ('allowed_models', models.JSONField(blank=True, default=list)),
                        ('rpm_limit', models.PositiveIntegerField(blank=True, null=True)),
                        ('budgets', models.JSONField(blank=True, default=list, validators=[usage.budgets.validate_budgets])),
                        ('created', models.DateTimeField(auto_now_add=True)),
                        ('updated', models.DateTimeField(auto_now=True)),
                        ('revoked', models.DateTimeField(blank=True, null=True)),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='client_keys', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'ocxsite_clientkey',
                        'ordering': ('-created',),
                    },
                ),
                migrations.CreateModel(
                    name='ManagementToken',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(blank=True, default='', max_length=64)),
                        ('prefix', models.CharField(max_length=16)),
                        ('digest', models.CharField(max_length=64, unique=True)),
                        ('created', models.DateTimeField(auto_now_add=True)),
                        ('revoked', models.DateTimeField(blank=True, null=True)),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='mgmt_tokens', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'ocxsite_managementtoken',
                        'ordering': ('-created',),
                    },
                ),
                migrations.CreateModel(
                    name='UserBudget',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('budgets', models.JSONField(blank=True, default=list, validators=[usage.budgets.validate_budgets])),
                        ('updated', models.DateTimeField(auto_now=True)),
                        ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='ocx_budget', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'ocxsite_userbudget',
                        'ordering': ('user__username',),
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(forwards, backwards),
    ]
